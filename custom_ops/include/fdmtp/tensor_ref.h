// TensorRef: a framework-free view of one op argument (name, pointer, dtype, shape,
// device), plus the boundary checks every op entry runs before it touches memory.
//
// Both bindings build TensorRefs from their own tensor type (paddle::Tensor in
// custom_ops/paddle/, DLPack or raw pointers in custom_ops/pybind/) and call the same op
// entry (custom_ops/entry/), so the checks and their messages are the same everywhere.
// Host-only header.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fdmtp {

enum class DType : int {
  kBool,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kUnsupported,
};

enum class Device : int {
  kCPU,  // host memory (pageable or pinned)
  kCUDA,
  kXPU,
  kOther,
};

const char* DTypeName(DType dtype);
// Bytes of one element (0 for kUnsupported).
size_t DTypeBytes(DType dtype);
const char* DeviceName(Device device);

// An error in the caller's arguments, or a backend failure. The message names the op and
// the argument. Bindings convert it to their framework's exception.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The most elements a tensor argument may have: its byte count (8-byte elements) and any
// index computed from it stay far from int64 overflow.
constexpr int64_t kMaxElements = int64_t{1} << 56;

struct TensorRef {
  const char* name = "";  // the argument's name in the op signature
  void* data = nullptr;
  DType dtype = DType::kUnsupported;
  Device device = Device::kCPU;
  int device_id = 0;
  std::vector<int64_t> shape;
  bool contiguous = true;

  int64_t dim(size_t i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string ShapeString() const;
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// An optional op argument (paddle::Optional input, or None in the framework-free module):
// std::nullopt when the caller passed none. Entries pass `Present()` refs to the usual
// checks and hand kernels a null pointer for an absent one (see `DataOrNull`).
using OptionalTensorRef = std::optional<TensorRef>;

template <typename T>
T* DataOrNull(const OptionalTensorRef& t) {
  return t ? t->ptr<T>() : nullptr;
}

// Collects the checks of one op call so every message starts with the op's name.
class ArgChecker {
 public:
  explicit ArgChecker(const char* op) : op_(op) {}

  [[noreturn]] void Fail(const std::string& message) const;

  void Dtype(const TensorRef& t, DType expected) const;
  void Rank(const TensorRef& t, size_t rank) const;
  void Contiguous(const TensorRef& t) const;
  // A per-item vector: shape [m] or [m, 1] with m >= n. Upstream kernels read entries
  // 0..n-1 only, and its callers pass arrays padded to max_bsz, so extra rows are accepted
  // (and never read).
  void PerItem(const TensorRef& t, int64_t n, const TensorRef& source) const;
  // A matrix of at least n rows: rank 2 and shape[0] >= n (batch size taken from `source`);
  // rows past n are not read.
  void Rows(const TensorRef& t, int64_t n, const TensorRef& source) const;
  // PerItem and Rows of each tensor in turn (the first failing one is reported).
  void PerItem(std::initializer_list<const TensorRef*> tensors, int64_t n,
               const TensorRef& source) const;
  void Rows(std::initializer_list<const TensorRef*> tensors, int64_t n,
            const TensorRef& source) const;
  // Non-negative dimensions whose element count (and byte count) fits in int64, and memory
  // behind a non-empty tensor (a raw-pointer tuple may carry address 0).
  void Storage(const TensorRef& t) const;
  // Exactly `n` elements, any shape (e.g. a [1] flag).
  void Numel(const TensorRef& t, int64_t n) const;
  // An attribute that must be >= minimum.
  void AttrAtLeast(const char* attr, int64_t value, int64_t minimum) const;
  // A flat vector [n] or [n, 1]; returns n (the batch size, or a row count).
  int64_t ItemCount(const TensorRef& t) const;
  // t.shape[i] == other.shape[j]
  void DimEq(const TensorRef& t, size_t i, const TensorRef& other, size_t j) const;
  // Every tensor lives on the same device as the first one.
  void SameDevice(const std::vector<const TensorRef*>& tensors) const;
  // Every tensor is in host memory (the host-only ops; their Paddle binding copies device
  // tensors to the host first).
  void OnHost(const std::vector<const TensorRef*>& tensors) const;
  // An optional argument that this call needs; `why` completes "required when ...".
  const TensorRef& Required(const OptionalTensorRef& t, const char* name,
                            const std::string& why) const;

 private:
  const char* op_;
};

// The present tensors among `refs` (for SameDevice / Contiguous over optional inputs).
std::vector<const TensorRef*> Present(std::initializer_list<const OptionalTensorRef*> refs);

}  // namespace fdmtp
