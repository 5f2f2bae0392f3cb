// paddle::Tensor -> fdmtp::TensorRef, and the translation of fdmtp::Error into Paddle's
// exception, for every op binding in this folder.
#pragma once

#include <utility>
#include <vector>

#include "fdmtp/ops.h"
#include "paddle/extension.h"

namespace fdmtp {
namespace paddle_binding {

// Describes `tensor` under the op-signature name `name` (the name must outlive the ref).
TensorRef ToRef(const paddle::Tensor& tensor, const char* name);

// An optional input (paddle::Optional in .Inputs): std::nullopt when the caller passed None.
OptionalTensorRef ToOptionalRef(const paddle::optional<paddle::Tensor>& tensor, const char* name);

// The cudaStream_t the tensor's work is ordered on (nullptr for host tensors).
void* StreamOf(const paddle::Tensor& tensor);

// A TensorRef named after the C++ parameter, which is named after the op's input.
#define FDMTP_REF(tensor) ::fdmtp::paddle_binding::ToRef(tensor, #tensor)
// The same for a paddle::optional input.
#define FDMTP_OPT_REF(tensor) ::fdmtp::paddle_binding::ToOptionalRef(tensor, #tensor)
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

}  // namespace paddle_binding
}  // namespace fdmtp
