// Framework-free op entries: validate every argument (messages name the argument and the
// op), then dispatch on the tensors' device to the CPU kernel, the CUDA launcher or the
// XPU plugin. Nothing is written before every check has passed, so a rejected call
// leaves every input unchanged. Throws fdmtp::Error.
//
// The Paddle binding (custom_ops/paddle/) and the framework-free Python module
// (custom_ops/pybind/) both call these, so behaviour and messages match across bindings.
#pragma once

#include <cstddef>

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

}  // namespace fdmtp
