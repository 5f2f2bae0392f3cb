// Paddle bindings of set_data_ipc, share_external_data and unset_data_ipc: FastDeploy's
// inputs, outputs, attrs and in-place map. Builds with FDMTP_WITH_XPU register
// share_external_data with upstream's XPU attrs (shm_name, shape, use_ipc: bool); the
// others with upstream's GPU attrs (shm_name, shape).
//
// Host tensors: set_data_ipc moves the tensor's storage into the named segment by giving
// its DenseTensor a new holder (an IpcAllocation that owns the mapping), so the same
// Python tensor keeps working on shared memory. share_external_data returns a tensor whose
// holder owns the attachment. Either way the memory is released with the last tensor that
// views it, never while one still does.
#include "paddle_tensor.h"

#include "paddle/phi/core/allocator.h"
#include "paddle/phi/core/dense_tensor.h"

namespace {

namespace pb = fdmtp::paddle_binding;

// Storage that is a cross-process mapping (host segment or opened CUDA / XPU IPC handle).
class IpcAllocation : public phi::Allocation {
 public:
  IpcAllocation(std::shared_ptr<fdmtp::ipc::SharedBuffer> buffer, const phi::Place& place)
      : phi::Allocation(buffer->data(), buffer->bytes(), place), buffer_(std::move(buffer)) {}

 private:
  std::shared_ptr<fdmtp::ipc::SharedBuffer> buffer_;
};

phi::DenseTensor* Dense(const paddle::Tensor& t, const char* name) {
  auto* dense = dynamic_cast<phi::DenseTensor*>(t.impl().get());
  if (dense == nullptr) throw fdmtp::Error(std::string("`") + name + "` must be a dense tensor");
  return dense;
}

phi::Place PlaceOf(const fdmtp::ipc::SharedBuffer& buffer) {
  if (buffer.device() == fdmtp::Device::kCUDA) return phi::GPUPlace(buffer.device_id());
#if defined(FDMTP_WITH_XPU)
  if (buffer.device() == fdmtp::Device::kXPU) return phi::XPUPlace(buffer.device_id());
#endif
  if (buffer.device() != fdmtp::Device::kCPU) {
    throw fdmtp::Error(
        "share_external_data: this build cannot place shared XPU memory in a Paddle tensor");
  }
  return phi::CPUPlace();
}

void SetDataIpc(const paddle::Tensor& tmp_input, const std::string& shm_name) {
  pb::RunEntry([&] {
    fdmtp::TensorRef ref = FDMTP_REF(tmp_input);
    phi::DenseTensor* dense = Dense(tmp_input, "tmp_input");
    if (ref.device == fdmtp::Device::kCPU && dense->meta().offset != 0) {
      throw fdmtp::Error("set_data_ipc: `tmp_input` is a view at byte offset " +
                         std::to_string(dense->meta().offset) +
                         " of another tensor's storage; share a tensor that owns its storage");
    }
    if (ref.device == fdmtp::Device::kCPU && ref.numel() != 0 && ref.data == nullptr) {
      throw fdmtp::Error("set_data_ipc: `tmp_input` is not initialized");
    }
    std::shared_ptr<fdmtp::ipc::SharedBuffer> buffer = fdmtp::SetDataIpc(ref, shm_name);
    if (buffer) {  // host: the tensor's storage becomes the segment (contents copied)
      phi::DenseTensorMeta meta = dense->meta();
      meta.offset = 0;
      const phi::DenseTensor moved(std::make_shared<IpcAllocation>(buffer, PlaceOf(*buffer)), meta);
      dense->ShareDataWith(moved);  // holder and meta; the tensor object stays the same
    }
  });
}

std::vector<paddle::Tensor> ShareExternal(const paddle::Tensor& input, const std::string& shm_name,
                                          const std::vector<int>& shape, bool use_ipc) {
  std::vector<paddle::Tensor> out;
  pb::RunEntry([&] {
    std::vector<int64_t> dims(shape.begin(), shape.end());
    fdmtp::TensorRef ref = FDMTP_REF(input);
    ref.shape.clear();  // the placeholder gives the dtype and device only
    std::shared_ptr<fdmtp::ipc::SharedBuffer> buffer =
        fdmtp::ShareExternalData(ref, shm_name, dims, use_ipc);
    const phi::DenseTensorMeta meta(input.dtype(), phi::make_ddim(dims));
    out.emplace_back(std::make_shared<phi::DenseTensor>(
        std::make_shared<IpcAllocation>(buffer, PlaceOf(*buffer)), meta));
  });
  return out;
}

#if defined(FDMTP_WITH_XPU)
std::vector<paddle::Tensor> ShareExternalData(const paddle::Tensor& input,
                                              const std::string& shm_name,
                                              const std::vector<int>& shape, bool use_ipc) {
  return ShareExternal(input, shm_name, shape, use_ipc);
}
#else
std::vector<paddle::Tensor> ShareExternalData(const paddle::Tensor& input,
                                              const std::string& shm_name,
                                              const std::vector<int>& shape) {
  return ShareExternal(input, shm_name, shape, true);
}
#endif

void UnsetDataIpc(const paddle::Tensor& tmp_input, const std::string& shm_name, bool close_ipc,
                  bool unlink_shm) {
  pb::RunEntry([&] {
    phi::DenseTensor* dense = Dense(tmp_input, "tmp_input");
    fdmtp::TensorRef ref;
    ref.name = "tmp_input";
    fdmtp::UnsetDataIpc(ref, shm_name, unlink_shm);
    // close_ipc: this tensor lets go of its attachment and becomes uninitialized; the
    // mapping (or CUDA handle) is released once no other tensor views it. A tensor that
    // owns ordinary memory (a CUDA exporter's) has no attachment and is left as is.
    if (close_ipc && dynamic_cast<const IpcAllocation*>(dense->Holder().get()) != nullptr) {
      dense->clear();
    }
  });
}

std::vector<std::vector<int64_t>> ShareExternalDataShape(const std::vector<int64_t>&,
                                                         const std::string&,
                                                         const std::vector<int>& shape
#if defined(FDMTP_WITH_XPU)
                                                         ,
                                                         bool
#endif
) {
  return {std::vector<int64_t>(shape.begin(), shape.end())};
}

std::vector<paddle::DataType> ShareExternalDataDtype(const paddle::DataType& input) {
  return {input};
}

}  // namespace

PD_BUILD_OP(set_data_ipc)
    .Inputs({"tmp_input"})
    .Attrs({"shm_name: std::string"})
    .Outputs({"tmp_input_out"})
    .SetInplaceMap({{"tmp_input", "tmp_input_out"}})
    .SetKernelFn(PD_KERNEL(SetDataIpc));

PD_BUILD_OP(share_external_data)
    .Inputs({"input"})
#if defined(FDMTP_WITH_XPU)
    .Attrs({"shm_name: std::string", "shape: std::vector<int>", "use_ipc: bool"})
#else
    .Attrs({"shm_name: std::string", "shape: std::vector<int>"})
#endif
    .Outputs({"output"})
    .SetKernelFn(PD_KERNEL(ShareExternalData))
    .SetInferShapeFn(PD_INFER_SHAPE(ShareExternalDataShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(ShareExternalDataDtype));

PD_BUILD_OP(unset_data_ipc)
    .Inputs({"tmp_input"})
    .Attrs({"shm_name: std::string", "close_ipc: bool", "unlink_shm: bool"})
    .SetKernelFn(PD_KERNEL(UnsetDataIpc));
