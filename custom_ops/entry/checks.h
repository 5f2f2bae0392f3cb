// Argument checks shared by the op entries of this folder (on top of ArgChecker).
#pragma once

#include <string>

#include "fdmtp/tensor_ref.h"

namespace fdmtp {

// A contiguous int32 per-item tensor ([n] or [n, 1]).
inline void CheckPerItemInt32(const ArgChecker& check, const TensorRef& t, int64_t n,
                              const TensorRef& source) {
  check.Dtype(t, DType::kInt32);
  check.PerItem(t, n, source);
  check.Contiguous(t);
}

// The batch size, from a per-item tensor.
inline int64_t BatchSize(const ArgChecker& check, const TensorRef& t) {
  if (t.shape.empty()) check.Rank(t, 1);
  return t.dim(0);
}

// A contiguous tensor of `dtype` with exactly `shape`; `why` says where the shape comes from.
inline void CheckShape(const ArgChecker& check, const TensorRef& t, DType dtype,
                       const std::vector<int64_t>& shape, const std::string& why) {
  check.Dtype(t, dtype);
  if (t.shape != shape) {
    TensorRef expected;
    expected.shape = shape;
    check.Fail(std::string("`") + t.name + "` must have shape " + expected.ShapeString() + " (" +
               why + "), got " + t.ShapeString());
  }
  check.Contiguous(t);
}

}  // namespace fdmtp
