// Python objects -> fdmtp::TensorRef for the framework-free module. Accepted:
//   * any object with __dlpack__ (numpy, CuPy, torch, paddle): zero-copy, with the
//     producer's dtype, shape, strides and device;
//   * a raw-pointer tuple (data_ptr: int, dtype: str, shape: tuple[int, ...], device: str),
//     e.g. (t.data_ptr(), "int64", (8, 4), "cuda:0"), for callers holding bare pointers.
#pragma once

#include <pybind11/pybind11.h>

#include <deque>

#include "fdmtp/tensor_ref.h"

namespace fdmtp {
namespace pybind {

// Holds the DLPack capsules of one call alive until the kernel has been launched. Errors in
// converting an argument name the op (`op`) and the argument.
class ArgScope {
 public:
  explicit ArgScope(const char* op = "") : op_(op) {}
  TensorRef Convert(const pybind11::handle& obj, const char* name);
  // An optional argument: None -> std::nullopt, anything else as Convert.
  OptionalTensorRef ConvertOptional(const pybind11::handle& obj, const char* name);
  // An integer attr that must fit in `bits` (32 or 64) signed bits; bools are refused.
  int64_t IntAttr(const pybind11::handle& obj, const char* name, int bits) const;
  // A bool attr: a Python or numpy bool, or the integers 0 and 1.
  bool BoolAttr(const pybind11::handle& obj, const char* name) const;

 private:
  TensorRef ConvertUnchecked(const pybind11::handle& obj, const char* name);
  [[noreturn]] void Fail(const char* name, const std::string& message) const;

  const char* op_;
  std::deque<pybind11::object> keep_alive_;
};

}  // namespace pybind
}  // namespace fdmtp
