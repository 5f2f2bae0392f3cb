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

}  // namespace fdmtp
