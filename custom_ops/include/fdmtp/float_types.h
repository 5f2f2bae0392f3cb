// Storage types for the 16-bit floats, shared by every backend. The ops in this package
// that take float tensors only move them (bit-exact copies), so these are plain 16-bit
// containers: an op that needs arithmetic on them converts explicitly to float first.
#pragma once

#include <cstdint>

namespace fdmtp {

struct Float16 {
  uint16_t bits;  // IEEE 754 binary16
};
struct BFloat16 {
  uint16_t bits;  // bfloat16: the high half of a float32
};
static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "16-bit float storage");

}  // namespace fdmtp

// Expands M(T) once per float storage type: explicit instantiations of kernels templated
// on the element type (the list DispatchFloat in dtype_dispatch.h selects from).
#define FDMTP_FOR_EACH_FLOAT_TYPE(M) M(float) M(::fdmtp::Float16) M(::fdmtp::BFloat16)
