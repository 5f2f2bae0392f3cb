// Framework-free op entries: validate every argument (messages name the argument and the
// op), then dispatch on the tensors' device to the CPU kernel, the CUDA launcher or the
// XPU plugin. Nothing is written before every check has passed, so a rejected call
// leaves every input unchanged. Throws fdmtp::Error.
//
// The Paddle binding (custom_ops/paddle/) and the framework-free Python module
// (custom_ops/pybind/) both call these, so behaviour and messages match across bindings.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "fdmtp/ipc.h"
#include "fdmtp/tensor_ref.h"

namespace fdmtp {

// Where the build put each backend; reported by fastdeploy_mtp.ops.backends().
bool BuiltWithCuda();
bool BuiltWithXpu();

// Device scratch for the ops that need some (the n-gram ops), provided by the binding from
// its framework's stream-ordered allocator. Allocate is called after every check passed,
// only for device tensors; the memory must stay usable by the work queued on the op's
// stream after the allocator is destroyed (stream-ordered release).
class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
};

// See fdmtp/draft_model_postprocess.h. `stream` is the cudaStream_t for CUDA tensors.
void DraftModelPostprocess(const TensorRef& base_model_draft_tokens,
                           const TensorRef& base_model_seq_lens_this_time,
                           const TensorRef& base_model_seq_lens_encoder,
                           const TensorRef& base_model_stop_flags, void* stream);

// See fdmtp/draft_model_preprocess.h. 17 inputs in FastDeploy's order.
void DraftModelPreprocess(const TensorRef& draft_tokens, const TensorRef& input_ids,
                          const TensorRef& stop_flags, const TensorRef& seq_lens_this_time,
                          const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                          const TensorRef& step_idx, const TensorRef& not_need_stop,
                          const TensorRef& pre_ids, const TensorRef& accept_tokens,
                          const TensorRef& accept_num,
                          const TensorRef& target_model_seq_lens_encoder,
                          const TensorRef& target_model_seq_lens_decoder,
                          const TensorRef& target_model_step_idx,
                          const TensorRef& target_model_stop_flags, const TensorRef& max_dec_len,
                          const TensorRef& target_model_draft_tokens, int num_model_step,
                          bool is_splitwise_prefill, void* stream);

// See fdmtp/draft_model_update.h. 13 inputs in FastDeploy's order.
void DraftModelUpdate(const TensorRef& inter_next_tokens, const TensorRef& draft_tokens,
                      const TensorRef& pre_ids, const TensorRef& seq_lens_this_time,
                      const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                      const TensorRef& step_idx, const TensorRef& cu_seqlens_q_output,
                      const TensorRef& stop_flags, const TensorRef& not_need_stop,
                      const TensorRef& max_dec_len, const TensorRef& end_ids,
                      const TensorRef& base_model_draft_tokens, int max_seq_len, int substep,
                      void* stream);

// See fdmtp/mtp_step_paddle.h. 11 inputs in FastDeploy's order.
void MtpStepPaddle(const TensorRef& base_model_stop_flags, const TensorRef& stop_flags,
                   const TensorRef& batch_drop, const TensorRef& seq_lens_this_time,
                   const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                   const TensorRef& block_tables, const TensorRef& encoder_block_lens,
                   const TensorRef& used_list_len, const TensorRef& free_list,
                   const TensorRef& free_list_len, int block_size, int max_draft_tokens,
                   void* stream);

// See fdmtp/speculate_pre_process.h. 5 inputs, then the 7 outputs (allocated by the
// caller; every slot is written), then the cpu_token_num attr.
void SpeculatePreProcess(const TensorRef& input_ids, const TensorRef& seq_len,
                         const TensorRef& draft_tokens, const TensorRef& seq_lens_encoder,
                         const TensorRef& seq_lens_decoder, const TensorRef& ids_remove_padding,
                         const TensorRef& batch_id_per_token, const TensorRef& cu_seqlens_q,
                         const TensorRef& cu_seqlens_k, const TensorRef& cu_seq_lens_q_output,
                         const TensorRef& batch_id_per_token_output,
                         const TensorRef& real_output_token_num, int64_t cpu_token_num,
                         void* stream);
// See fdmtp/unified_update_model_status.h. has_running_seqs must be device memory for
// CUDA tensors (it is written by the kernel, never read back on the host).
void UnifiedUpdateModelStatus(const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                              const TensorRef& has_running_seqs, const TensorRef& step_input_ids,
                              const TensorRef& step_output_ids, const TensorRef& step_output_len,
                              const TensorRef& stop_flags, const TensorRef& seq_lens_this_time,
                              const TensorRef& is_paused, const TensorRef& token_ids_all,
                              const TensorRef& prompt_lens, const TensorRef& step_idx,
                              const TensorRef& end_tokens, const TensorRef& max_dec_len,
                              void* stream);

// See fdmtp/verify_draft_tokens.h. FastDeploy's 17 inputs, then the optional
// verify_uniforms, then the attrs (max_seq_len and verify_window are accepted and unused,
// as upstream).
void VerifyDraftTokens(const TensorRef& step_output_ids, const TensorRef& step_output_len,
                       const TensorRef& step_input_ids, const OptionalTensorRef& target_tokens,
                       const OptionalTensorRef& candidate_ids,
                       const OptionalTensorRef& candidate_scores,
                       const OptionalTensorRef& candidate_lens, const TensorRef& topp,
                       const TensorRef& stop_flags, const TensorRef& seq_lens_encoder,
                       const TensorRef& seq_lens_this_time, const TensorRef& end_tokens,
                       const TensorRef& is_block_step, const TensorRef& cu_seqlens_q_output,
                       const TensorRef& reasoning_status, const TensorRef& max_dec_len,
                       const TensorRef& step_idx, const OptionalTensorRef& verify_uniforms,
                       int max_seq_len, int verify_window, int verify_strategy, bool reject_all,
                       bool accept_all, void* stream);
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
// See fdmtp/hybrid_mtp_ngram.h. threshold: the global token-number threshold
// (upstream's SPEC_TOKENUM_THRESHOLD); num_threads: CPU threads for the search (<= 0:
// chosen from the work; results never depend on it).
void HybridMtpNgram(const TensorRef& input_ids, const TensorRef& input_ids_len,
                    const TensorRef& pre_ids, const TensorRef& step_idx,
                    const TensorRef& draft_token_num, const TensorRef& draft_tokens,
                    const TensorRef& seq_lens_this_time, const TensorRef& seq_lens_decoder,
                    const TensorRef& max_dec_len, int max_ngram_size, int min_ngram_size,
                    int max_draft_tokens, int threshold, int num_threads, void* stream,
                    ScratchAllocator* scratch);

// See fdmtp/ngram_match.h. threshold: upstream's INFER_WITH_REFERENCE_TOKENUM_THRESHOLD.
void NgramMatch(const TensorRef& input_ids, const TensorRef& input_ids_len,
                const TensorRef& token_ids_all, const TensorRef& prompt_lens,
                const TensorRef& step_idx, const TensorRef& draft_token_num,
                const TensorRef& draft_tokens, const TensorRef& seq_lens_this_time,
                const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                const TensorRef& max_dec_len, int max_ngram_size, int max_draft_tokens,
                int threshold, int num_threads, void* stream, ScratchAllocator* scratch);

// Cross-process tensors by name (fdmtp/ipc.h; entry/ipc.cc). Host tensors: SetDataIpc
// creates segment `shm_name` (replacing a stale one), copies the tensor's bytes into it and
// returns the mapping; the binding must make the tensor's storage that mapping. CUDA / XPU
// tensors (XPU: also host tensors inside the emulator's xpu_emulation): exports the
// memory's IPC handle into the segment and returns nullptr.
std::shared_ptr<ipc::SharedBuffer> SetDataIpc(const TensorRef& tmp_input,
                                              const std::string& shm_name);
// Attaches segment `shm_name` as a tensor of `input`'s dtype and device and `shape`;
// checks the name, the dtype, the device kind and that the shape fits. The returned
// buffer (mapped host memory or an opened CUDA / XPU handle) is released with its last
// owner. use_ipc (upstream's XPU attr): false reuses an XPU segment's stored device
// pointer instead of opening its handle; only in the creator's process (checked).
std::shared_ptr<ipc::SharedBuffer> ShareExternalData(const TensorRef& input,
                                                     const std::string& shm_name,
                                                     const std::vector<int64_t>& shape,
                                                     bool use_ipc = true);
// Checks the name and, with unlink_shm, unlinks the segment (a missing one is fine).
// close_ipc is carried out by the binding, which owns the tensor's storage.
void UnsetDataIpc(const TensorRef& tmp_input, const std::string& shm_name, bool unlink_shm);

}  // namespace fdmtp
