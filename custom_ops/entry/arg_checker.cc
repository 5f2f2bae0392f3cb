#include "fdmtp/tensor_ref.h"

namespace fdmtp {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kUnsupported: break;
  }
  return "unsupported dtype";
}

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64: return 8;
    case DType::kUnsupported: break;
  }
  return 0;
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCPU: return "cpu";
    case Device::kCUDA: return "cuda";
    case Device::kXPU: return "xpu";
    case Device::kOther: break;
  }
  return "unsupported device";
}

std::string TensorRef::ShapeString() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

void ArgChecker::Fail(const std::string& message) const {
  throw Error(std::string(op_) + ": " + message);
}

void ArgChecker::Dtype(const TensorRef& t, DType expected) const {
  if (t.dtype != expected) {
    Fail(std::string("`") + t.name + "` must be " + DTypeName(expected) + ", got " +
         DTypeName(t.dtype));
  }
}

void ArgChecker::Rank(const TensorRef& t, size_t rank) const {
  if (t.shape.size() != rank) {
    Fail(std::string("`") + t.name + "` must have rank " + std::to_string(rank) + ", got shape " +
         t.ShapeString());
  }
}

void ArgChecker::Contiguous(const TensorRef& t) const {
  if (!t.contiguous) Fail(std::string("`") + t.name + "` must be contiguous");
}

void ArgChecker::PerItem(const TensorRef& t, int64_t n, const TensorRef& source) const {
  const bool ok = (t.shape.size() == 1 && t.shape[0] >= n) ||
                  (t.shape.size() == 2 && t.shape[0] >= n && t.shape[1] == 1);
  if (!ok) {
    Fail(std::string("`") + t.name +
         "` must have shape [m] or [m, 1] with m >= " + std::to_string(n) + " (batch size from `" +
         source.name + "`; rows past it are not read), got " + t.ShapeString());
  }
}

void ArgChecker::Rows(const TensorRef& t, int64_t n, const TensorRef& source) const {
  if (t.shape.size() != 2 || t.shape[0] < n) {
    Fail(std::string("`") + t.name + "` must have shape [m, *] with m >= " + std::to_string(n) +
         " (batch size from `" + source.name + "`; rows past it are not read), got " +
         t.ShapeString());
  }
}

void ArgChecker::PerItem(std::initializer_list<const TensorRef*> tensors, int64_t n,
                         const TensorRef& source) const {
  for (const TensorRef* t : tensors) PerItem(*t, n, source);
}

void ArgChecker::Rows(std::initializer_list<const TensorRef*> tensors, int64_t n,
                      const TensorRef& source) const {
  for (const TensorRef* t : tensors) Rows(*t, n, source);
}

void ArgChecker::Storage(const TensorRef& t) const {
  // Dimensions are non-negative and the element and byte counts fit in int64 (a shape from a
  // raw-pointer tuple or DLPack is caller data), and a non-empty tensor has memory.
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) Fail(std::string("`") + t.name + "` has a negative dimension: " + t.ShapeString());
    if (d != 0 && n > kMaxElements / d) {
      Fail(std::string("`") + t.name +
           "` has more elements than this op can address: " + t.ShapeString());
    }
    n *= d;
  }
  if (n != 0 && t.data == nullptr) {
    Fail(std::string("`") + t.name + "` has " + std::to_string(n) +
         " element(s) but a null data pointer");
  }
}

void ArgChecker::Numel(const TensorRef& t, int64_t n) const {
  if (t.numel() != n) {
    Fail(std::string("`") + t.name + "` must have " + std::to_string(n) +
         " element(s), got shape " + t.ShapeString());
  }
}

void ArgChecker::AttrAtLeast(const char* attr, int64_t value, int64_t minimum) const {
  if (value < minimum) {
    Fail(std::string("attr `") + attr + "` must be >= " + std::to_string(minimum) + ", got " +
         std::to_string(value));
  }
}

int64_t ArgChecker::ItemCount(const TensorRef& t) const {
  const bool ok = t.shape.size() == 1 || (t.shape.size() == 2 && t.shape[1] == 1);
  if (!ok) {
    Fail(std::string("`") + t.name + "` must have shape [n] or [n, 1], got " + t.ShapeString());
  }
  return t.shape[0];
}

void ArgChecker::DimEq(const TensorRef& t, size_t i, const TensorRef& other, size_t j) const {
  if (t.shape[i] != other.shape[j]) {
    Fail(std::string("`") + t.name + "`.shape[" + std::to_string(i) + "] must equal `" +
         other.name + "`.shape[" + std::to_string(j) + "] = " + std::to_string(other.shape[j]) +
         ", got " + std::to_string(t.shape[i]) + " (shape " + t.ShapeString() + ")");
  }
}

void ArgChecker::SameDevice(const std::vector<const TensorRef*>& tensors) const {
  const TensorRef& first = *tensors.front();
  for (const TensorRef* t : tensors) {
    if (t->device != first.device || t->device_id != first.device_id) {
      Fail(std::string("`") + t->name + "` is on " + DeviceName(t->device) + ":" +
           std::to_string(t->device_id) + " but `" + first.name + "` is on " +
           DeviceName(first.device) + ":" + std::to_string(first.device_id) +
           "; all tensors must be on one device");
    }
  }
}

void ArgChecker::OnHost(const std::vector<const TensorRef*>& tensors) const {
  for (const TensorRef* t : tensors) {
    if (t->device != Device::kCPU) {
      Fail(std::string("`") + t->name + "` is on " + DeviceName(t->device) + ":" +
           std::to_string(t->device_id) +
           "; this op runs on the host and takes host tensors only (the Paddle op copies "
           "device tensors to the host itself)");
    }
  }
}

const TensorRef& ArgChecker::Required(const OptionalTensorRef& t, const char* name,
                                      const std::string& why) const {
  if (!t) Fail(std::string("`") + name + "` is required when " + why + ", got None");
  return *t;
}

std::vector<const TensorRef*> Present(std::initializer_list<const OptionalTensorRef*> refs) {
  std::vector<const TensorRef*> out;
  for (const OptionalTensorRef* r : refs) {
    if (*r) out.push_back(&**r);
  }
  return out;
}

}  // namespace fdmtp
