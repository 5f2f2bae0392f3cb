// Argument checks shared by the ops' Prepare functions (cpu/<op>.cc), on top of ArgChecker.
#pragma once

#include <string>

#include "fdmtp/tensor_ref.h"

namespace fdmtp {

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
