// The only translation unit compiled with -DPADDLE_WITH_CUDA (and -DPADDLE_NO_PYTHON):
// paddle::Tensor::stream() is declared only under that macro. On the CPU wheel the
// symbol resolves to the custom-device variant (same mangled name), so this .so still
// loads there; it is only called for GPU tensors. Keeping the macro to this one unit keeps
// the rest of the Paddle binding free of Paddle's CUDA-only declarations.
#include "paddle/extension.h"

namespace fdmtp {
namespace paddle_binding {

void* GetCudaStream(const paddle::Tensor& tensor) { return static_cast<void*>(tensor.stream()); }

}  // namespace paddle_binding
}  // namespace fdmtp
