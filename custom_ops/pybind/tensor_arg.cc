#include "tensor_arg.h"

#include "dlpack.h"

#include <climits>
#include <cstdint>
#include <string>

namespace py = pybind11;

namespace fdmtp {
namespace pybind {
namespace {

DType FromDL(DLDataType t) {
  if (t.lanes != 1) return DType::kUnsupported;
  switch (t.code) {
    case kDLInt:
      return t.bits == 8    ? DType::kInt8
             : t.bits == 32 ? DType::kInt32
             : t.bits == 64 ? DType::kInt64
                            : DType::kUnsupported;
    case kDLUInt: return t.bits == 8 ? DType::kUInt8 : DType::kUnsupported;
    case kDLFloat:
      return t.bits == 16 ? DType::kFloat16 : t.bits == 32 ? DType::kFloat32 : DType::kUnsupported;
    case kDLBfloat: return t.bits == 16 ? DType::kBFloat16 : DType::kUnsupported;
    case kDLBool: return t.bits == 8 ? DType::kBool : DType::kUnsupported;
    default: return DType::kUnsupported;
  }
}

Device FromDL(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: return Device::kCPU;
    case kDLCUDA:
    case kDLCUDAManaged: return Device::kCUDA;
    default: return Device::kOther;
  }
}

DType ParseDType(const std::string& s, const char* name) {
  for (DType d : {DType::kBool, DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64,
                  DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    if (s == DTypeName(d)) return d;
  }
  throw Error(std::string("`") + name + "`: unknown dtype '" + s + "'");
}

void ParseDevice(const std::string& s, const char* name, TensorRef* ref) {
  const std::string kind = s.substr(0, s.find(':'));
  const std::string index = s.find(':') == std::string::npos ? "0" : s.substr(s.find(':') + 1);
  if (kind == "cpu") {
    ref->device = Device::kCPU;
  } else if (kind == "cuda" || kind == "gpu") {
    ref->device = Device::kCUDA;
  } else if (kind == "xpu") {
    ref->device = Device::kXPU;
  } else {
    throw Error(std::string("`") + name + "`: unknown device '" + s + "' (cpu, cuda:N, xpu:N)");
  }
  try {
    ref->device_id = std::stoi(index);
  } catch (const std::exception&) {
    throw Error(std::string("`") + name + "`: bad device index in '" + s + "'");
  }
}

TensorRef FromRawTuple(const py::tuple& t, const char* name) {
  TensorRef ref;
  ref.name = name;
  ref.data = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
  ref.dtype = ParseDType(t[1].cast<std::string>(), name);
  for (const py::handle& d : t[2].cast<py::tuple>()) ref.shape.push_back(d.cast<int64_t>());
  ParseDevice(t[3].cast<std::string>(), name, &ref);
  return ref;
}

bool IsRowMajor(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return true;  // no element: any strides describe it
  }
  int64_t expected = 1;
  for (int32_t i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

}  // namespace

// "<op>: " (nothing for a scope without an op name).
static std::string Prefix(const char* op) {
  return *op == '\0' ? std::string() : std::string(op) + ": ";
}

void ArgScope::Fail(const char* name, const std::string& message) const {
  throw Error(Prefix(op_) + "`" + name + "` " + message);
}

TensorRef ArgScope::Convert(const py::handle& obj, const char* name) {
  try {
    return ConvertUnchecked(obj, name);
  } catch (const Error& e) {
    const std::string what = e.what();
    // the parsers below name the argument; the op name is added here
    if (what.rfind(Prefix(op_), 0) == 0) throw;
    throw Error(Prefix(op_) + what);
  } catch (py::error_already_set& e) {
    // e.g. numpy's BufferError for a read-only array (DLPack cannot mark it read-only)
    const std::string what = e.what();
    e.restore();
    PyErr_Clear();
    Fail(name, "cannot be passed: " + what +
                   " (a read-only numpy array: pass a writable copy, np.array(x, copy=True))");
  } catch (const py::cast_error& e) {
    Fail(name, std::string("is a malformed raw-pointer tuple; expected (data_ptr: int, dtype: str, "
                           "shape: tuple[int, ...], device: str): ") +
                   e.what());
  }
}

int64_t ArgScope::IntAttr(const py::handle& obj, const char* name, int bits) const {
  const std::string what = std::string("attr `") + name + "`";
  if (PyBool_Check(obj.ptr()) || !PyIndex_Check(obj.ptr())) {
    throw Error(Prefix(op_) + what + " must be an integer, got " +
                py::str(py::type::of(obj)).cast<std::string>());
  }
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) {
    PyErr_Clear();
    throw Error(Prefix(op_) + what + " must be an integer");
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  const long long lo = bits == 32 ? INT32_MIN : INT64_MIN;
  const long long hi = bits == 32 ? INT32_MAX : INT64_MAX;
  if (overflow != 0 || v < lo || v > hi) {
    throw Error(Prefix(op_) + what + " = " + py::str(obj).cast<std::string>() +
                " does not fit in int" + std::to_string(bits));
  }
  return v;
}

bool ArgScope::BoolAttr(const py::handle& obj, const char* name) const {
  if (PyBool_Check(obj.ptr())) return obj.ptr() == Py_True;
  if (py::hasattr(obj, "dtype") && py::str(obj.attr("dtype")).cast<std::string>() == "bool") {
    return obj.attr("__bool__")().cast<bool>();
  }
  if (PyIndex_Check(obj.ptr())) {
    const int64_t v = IntAttr(obj, name, 64);
    if (v == 0 || v == 1) return v == 1;
  }
  throw Error(Prefix(op_) + "attr `" + name + "` must be a bool, got " +
              py::repr(obj).cast<std::string>());
}

TensorRef ArgScope::ConvertUnchecked(const py::handle& obj, const char* name) {
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 4) {
    return FromRawTuple(py::reinterpret_borrow<py::tuple>(obj), name);
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    throw Error(std::string("`") + name +
                "` must support __dlpack__ (numpy, CuPy, torch, paddle) or be a "
                "(data_ptr, dtype, shape, device) tuple, got " +
                py::str(py::type::of(obj)).cast<std::string>());
  }
  py::object capsule = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw Error(std::string("`") + name + "`: __dlpack__ did not return a 'dltensor' capsule");
  }
  keep_alive_.push_back(capsule);  // the capsule's destructor calls the producer's deleter
  const DLTensor& t = managed->dl_tensor;
  TensorRef ref;
  ref.name = name;
  ref.data = static_cast<char*>(t.data) + t.byte_offset;
  ref.dtype = FromDL(t.dtype);
  ref.device = FromDL(t.device);
  ref.device_id = t.device.device_id;
  ref.shape.assign(t.shape, t.shape + t.ndim);
  ref.contiguous = IsRowMajor(t);
  return ref;
}

OptionalTensorRef ArgScope::ConvertOptional(const py::handle& obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return Convert(obj, name);
}

}  // namespace pybind
}  // namespace fdmtp
