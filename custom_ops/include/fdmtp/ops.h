// Framework-free op entries: validate every argument (messages name the argument and the
// op), then dispatch on the tensors' device to the CPU kernel, the CUDA launcher or the
// XPU plugin. Nothing is written before every check has passed, so a rejected call
// leaves every input unchanged. Throws fdmtp::Error.
//
// The Paddle binding (custom_ops/paddle/) and the framework-free Python module
// (custom_ops/pybind/) both call these, so behaviour and messages match across bindings.
#pragma once

#include "fdmtp/tensor_ref.h"

namespace fdmtp {

// Where the build put each backend; reported by fastdeploy_mtp.ops.backends().
bool BuiltWithCuda();
bool BuiltWithXpu();

// See fdmtp/draft_model_postprocess.h. `stream` is the cudaStream_t for CUDA tensors.
void DraftModelPostprocess(const TensorRef& base_model_draft_tokens,
                           const TensorRef& base_model_seq_lens_this_time,
                           const TensorRef& base_model_seq_lens_encoder,
                           const TensorRef& base_model_stop_flags, void* stream);

// See fdmtp/eagle_get_hidden_states.h. `out` [T, H] (input's dtype) and
// `output_token_num` [1] int32 are the op's outputs, allocated by the caller.
void EagleGetHiddenStates(const TensorRef& input, const TensorRef& seq_lens_this_time,
                          const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                          const TensorRef& stop_flags, const TensorRef& accept_nums,
                          const TensorRef& base_model_seq_lens_this_time,
                          const TensorRef& base_model_seq_lens_encoder,
                          int64_t actual_draft_token_num, const TensorRef& out,
                          const TensorRef& output_token_num, void* stream);

// See fdmtp/eagle_get_self_hidden_states.h. Outputs as eagle_get_hidden_states.
void EagleGetSelfHiddenStates(const TensorRef& input, const TensorRef& last_seq_lens_this_time,
                              const TensorRef& seq_lens_this_time,
                              const TensorRef& seq_lens_encoder, const TensorRef& out,
                              const TensorRef& output_token_num, void* stream);

// See fdmtp/eagle_gather_hidden_states.h. `out` [bsz, H], `output_token_num` [1] int32.
void EagleGatherHiddenStates(const TensorRef& input, const TensorRef& cu_seqlens_q,
                             const TensorRef& seq_lens_this_time,
                             const TensorRef& seq_lens_decoder, const TensorRef& seq_lens_encoder,
                             const TensorRef& batch_id_per_token_output,
                             const TensorRef& cu_seqlens_q_output,
                             const TensorRef& real_output_token_num, const TensorRef& out,
                             const TensorRef& output_token_num, void* stream);

// See fdmtp/speculate_get_logits.h. In place.
void SpeculateGetLogits(const TensorRef& draft_logits, const TensorRef& next_token_num,
                        const TensorRef& batch_token_num, const TensorRef& cu_next_token_offset,
                        const TensorRef& cu_batch_token_offset, const TensorRef& logits,
                        const TensorRef& first_token_logits, const TensorRef& seq_lens_this_time,
                        const TensorRef& seq_lens_encoder, void* stream);

// See fdmtp/update_attn_mask_offsets.h. `attn_mask_offsets` [2 * T] int32 is the op's
// output, allocated by the caller; decode_states is in place.
void UpdateAttnMaskOffsets(const TensorRef& ids_remove_padding, const TensorRef& seq_lens_this_time,
                           const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                           const TensorRef& cu_seqlens_q, const TensorRef& attn_mask_offsets_full,
                           const TensorRef& is_block_step, const TensorRef& decode_states,
                           const TensorRef& attn_mask_offsets, void* stream);

}  // namespace fdmtp
