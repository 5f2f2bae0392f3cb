#include "paddle_tensor.h"

namespace fdmtp {
namespace paddle_binding {

#if defined(FDMTP_WITH_CUDA)
void* GetCudaStream(const paddle::Tensor& tensor);  // stream.cc, the PADDLE_WITH_CUDA unit
void* GetXpuStream(const paddle::Tensor& tensor);   // xpu_stream.cc, the PADDLE_WITH_XPU unit
#endif

namespace {

DType ToDType(phi::DataType dtype) {
  switch (dtype) {
    case phi::DataType::BOOL: return DType::kBool;
    case phi::DataType::INT8: return DType::kInt8;
    case phi::DataType::UINT8: return DType::kUInt8;
    case phi::DataType::INT32: return DType::kInt32;
    case phi::DataType::INT64: return DType::kInt64;
    case phi::DataType::FLOAT16: return DType::kFloat16;
    case phi::DataType::BFLOAT16: return DType::kBFloat16;
    case phi::DataType::FLOAT32: return DType::kFloat32;
    default: return DType::kUnsupported;
  }
}

Device ToDevice(const paddle::Tensor& tensor) {
  if (tensor.is_cpu() || tensor.is_gpu_pinned()) return Device::kCPU;
  if (tensor.is_gpu()) return Device::kCUDA;
  if (tensor.is_xpu()) return Device::kXPU;
  return Device::kOther;
}

}  // namespace

TensorRef ToRef(const paddle::Tensor& tensor, const char* name) {
  TensorRef ref;
  ref.name = name;
  if (!tensor.is_dense_tensor()) {
    throw Error(std::string("`") + name + "` must be a dense tensor");
  }
  ref.shape = tensor.shape();
  if (ref.numel() != 0) {  // an empty tensor has no allocation; nothing reads it
    if (!tensor.initialized()) {
      throw Error(std::string("`") + name + "` is not initialized (no memory allocated)");
    }
    ref.data = const_cast<void*>(tensor.data());
  }
  ref.dtype = ToDType(tensor.dtype());
  ref.device = ToDevice(tensor);
  ref.device_id = ref.device == Device::kCPU ? 0 : tensor.place().GetDeviceId();
  ref.contiguous = tensor.is_contiguous();
  return ref;
}

OptionalTensorRef ToOptionalRef(const paddle::optional<paddle::Tensor>& tensor, const char* name) {
  if (!tensor) return std::nullopt;
  return ToRef(*tensor, name);
}

void* StreamOf(const paddle::Tensor& tensor) {
#if defined(FDMTP_WITH_CUDA)
  if (tensor.is_gpu()) return GetCudaStream(tensor);
#endif
#if defined(FDMTP_WITH_XPU)
  if (tensor.is_xpu()) return GetXpuStream(tensor);
#endif
  (void)tensor;
  return nullptr;
}

void* PaddleScratch::Allocate(size_t bytes) {
  held_.push_back(paddle::empty({static_cast<int64_t>(bytes)}, phi::DataType::UINT8, place_));
  return held_.back().data();
}

}  // namespace paddle_binding
}  // namespace fdmtp
