// Runtime dtype -> C++ type, for op entries (host only). The default branch fails with a
// message naming the op, the tensor and its dtype:
//
//   DispatchFloat(check, input, [&](auto tag) {
//     using T = typename decltype(tag)::type;  // float, fdmtp::Float16 or fdmtp::BFloat16
//     cpu::MyOp<T>(args);
//   });
#pragma once

#include <string>
#include <utility>

#include "fdmtp/float_types.h"
#include "fdmtp/tensor_ref.h"

namespace fdmtp {

template <typename T>
struct TypeTag {
  using type = T;
};

// float32, float16 and bfloat16 tensors.
template <typename Fn>
decltype(auto) DispatchFloat(const ArgChecker& check, const TensorRef& t, Fn&& fn) {
  switch (t.dtype) {
    case DType::kFloat32: return std::forward<Fn>(fn)(TypeTag<float>{});
    case DType::kFloat16: return std::forward<Fn>(fn)(TypeTag<Float16>{});
    case DType::kBFloat16: return std::forward<Fn>(fn)(TypeTag<BFloat16>{});
    default: break;
  }
  check.Fail(std::string("`") + t.name + "` must be float32, float16 or bfloat16, got " +
             DTypeName(t.dtype));
}

}  // namespace fdmtp
