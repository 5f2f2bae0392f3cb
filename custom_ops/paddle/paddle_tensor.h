// paddle::Tensor -> fdmtp::TensorRef, the translation of fdmtp::Error into Paddle's
// exception, and the shape helpers of the generated Paddle bindings (paddle_ops.cc in the
// build folder) and of ipc_paddle_ops.cc.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fdmtp/ops.h"
#include "paddle/extension.h"

namespace fdmtp {
namespace paddle_binding {

// Dimension i of a shape (or of a tensor's shape); -1 when the shape has no dimension i.
// The output shapes in the op declarations are expressions over these.
inline int64_t Dim(const std::vector<int64_t>& shape, size_t i) {
  return i < shape.size() ? shape[i] : -1;
}
inline int64_t Dim(const paddle::Tensor& tensor, size_t i) { return Dim(tensor.shape(), i); }
// A shape to allocate: unknown (negative) dimensions become 0, so the op entry rejects the
// call with its own message instead of the allocator failing first.
inline std::vector<int64_t> Allocatable(std::vector<int64_t> shape) {
  for (int64_t& d : shape) d = d < 0 ? 0 : d;
  return shape;
}
// A shape for InferShape: negative dimensions are unknown (-1).
inline std::vector<int64_t> Inferred(std::vector<int64_t> shape) {
  for (int64_t& d : shape) d = d < 0 ? -1 : d;
  return shape;
}

// Describes `tensor` under the op-signature name `name` (the name must outlive the ref).
TensorRef ToRef(const paddle::Tensor& tensor, const char* name);

// An optional input (paddle::Optional in .Inputs): std::nullopt when the caller passed None.
OptionalTensorRef ToOptionalRef(const paddle::optional<paddle::Tensor>& tensor, const char* name);

// Host-only ops: `tensor` itself when it is in host memory, else a host copy (blocking).
inline paddle::Tensor OnHost(const paddle::Tensor& tensor) {
  if (!tensor.initialized() || tensor.is_cpu() || tensor.is_gpu_pinned()) return tensor;
  return tensor.copy_to(paddle::CPUPlace(), true);
}
// Host-only ops: after the call, copies the host copy of a written device tensor back into
// it (nothing to do when `host` is the tensor itself).
inline void CopyBack(const paddle::Tensor& tensor, const paddle::Tensor& host) {
  if (!tensor.initialized() || tensor.is_cpu() || tensor.is_gpu_pinned()) return;
  const_cast<paddle::Tensor&>(tensor).copy_(host, tensor.place(), true);
}

// The stream the tensor's work is ordered on: the cudaStream_t of CUDA tensors, the XPUStream
// of XPU tensors (builds with FDMTP_WITH_XPU), nullptr for host tensors.
void* StreamOf(const paddle::Tensor& tensor);

// A TensorRef named after the C++ parameter, which is named after the op's input.
#define FDMTP_REF(tensor) ::fdmtp::paddle_binding::ToRef(tensor, #tensor)
// Device scratch from Paddle's allocator on `place` (stream-ordered on the place's stream):
// the tensors live until this object is destroyed, after the op entry returned.
class PaddleScratch : public ScratchAllocator {
 public:
  explicit PaddleScratch(const phi::Place& place) : place_(place) {}
  void* Allocate(size_t bytes) override;

 private:
  phi::Place place_;
  std::vector<paddle::Tensor> held_;
};

// Runs an op entry and rethrows fdmtp::Error as Paddle's exception, which Python sees as
// an error whose message names the op and the argument.
template <typename Fn>
void RunEntry(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const Error& e) {
    PD_THROW(e.what());
  }
}

// The same for generated bindings: every failure inside (argument conversion, output
// allocation, the entry) reaches Python as "<op>: ..." so the wrapper can raise OpError.
template <typename Fn>
void RunEntry(const char* op, Fn&& fn) {
  const std::string prefix = std::string(op) + ": ";
  try {
    std::forward<Fn>(fn)();
  } catch (const Error& e) {
    const std::string what = e.what();
    PD_THROW(what.rfind(prefix, 0) == 0 ? what : prefix + what);
  } catch (const std::exception& e) {
    PD_THROW(prefix + e.what());
  }
}

}  // namespace paddle_binding
}  // namespace fdmtp
