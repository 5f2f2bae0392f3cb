// The XPU stream of a Paddle tensor's place, for the XPU3 kernels (builds with FDMTP_WITH_XPU
// only). Compiled with -DPADDLE_WITH_XPU: phi::XPUContext, whose stream() the place's device
// context holds, is declared only under that macro, and needs a Paddle built for XPU.
// Unverified on hardware: no Kunlun SDK or XPU build of Paddle is available to this project.
#include "paddle/extension.h"
#include "paddle/phi/api/include/context_pool.h"
#include "paddle/phi/backends/xpu/xpu_context.h"

namespace fdmtp {
namespace paddle_binding {

void* GetXpuStream(const paddle::Tensor& tensor) {
  const phi::DeviceContext* dev =
      paddle::experimental::DeviceContextPool::Instance().Get(tensor.place());
  return static_cast<void*>(static_cast<const phi::XPUContext*>(dev)->stream());
}

}  // namespace paddle_binding
}  // namespace fdmtp
