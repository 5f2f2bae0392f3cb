// The cross-process ops without Paddle. A framework-free caller cannot have its array's
// storage moved, so memory shared by name comes back as a `SharedTensor`: an object that
// owns the mapping (or opened CUDA handle) and exports it with DLPack
// (numpy.from_dlpack, torch.from_dlpack, cupy.from_dlpack: zero-copy). Every DLPack view
// keeps the mapping alive; it is released when the SharedTensor is closed or collected
// and the last view is gone. XPU memory: emulated device memory is host memory and exports
// as a CPU DLPack tensor; real Kunlun memory has no DLPack device and offers data_ptr only.
#include "ipc_bindings.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "dlpack.h"
#include "fdmtp/ops.h"
#include "tensor_arg.h"
#include "xpu/runtime/xpu_ipc.h"

namespace py = pybind11;

namespace fdmtp {
namespace pybind {
namespace {

DLDataType ToDL(DType dtype) {
  switch (dtype) {
    case DType::kInt8: return {kDLInt, 8, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kFloat32: return {kDLFloat, 32, 1};
    default: throw Error(std::string("no DLPack export for dtype ") + DTypeName(dtype));
  }
}

// The DLPack device of a buffer.
DLDevice DlDevice(const ipc::SharedBuffer& buffer) {
  switch (buffer.device()) {
    case Device::kCUDA: return {kDLCUDA, buffer.device_id()};
    case Device::kXPU:
#if defined(FDMTP_XPU_EMULATOR)
      return {kDLCPU, 0};  // the emulated XRE's device memory is host memory
#else
      throw Error("SharedTensor: XPU device memory has no DLPack device; use data_ptr");
#endif
    default: return {kDLCPU, 0};
  }
}

std::string DeviceText(const ipc::SharedBuffer& buffer) {
  switch (buffer.device()) {
    case Device::kCUDA: return "cuda:" + std::to_string(buffer.device_id());
    case Device::kXPU: return "xpu:" + std::to_string(buffer.device_id());
    default: return "cpu";
  }
}

class SharedTensor {
 public:
  SharedTensor(std::shared_ptr<ipc::SharedBuffer> buffer, DType dtype, std::vector<int64_t> shape)
      : buffer_(std::move(buffer)), dtype_(dtype), shape_(std::move(shape)) {}

  const ipc::SharedBuffer& buffer() const {
    if (!buffer_) throw Error("SharedTensor: closed (unset_data_ipc with close_ipc=True)");
    return *buffer_;
  }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(buffer().data()); }
  size_t nbytes() const { return buffer().bytes(); }
  std::string dtype() const { return DTypeName(dtype_); }
  py::tuple shape() const { return py::tuple(py::cast(shape_)); }
  std::string device() const { return DeviceText(buffer()); }
  bool closed() const { return !buffer_; }
  void close() { buffer_.reset(); }

  py::tuple DlpackDevice() const {
    const DLDevice d = DlDevice(buffer());
    return py::make_tuple(static_cast<int32_t>(d.device_type), d.device_id);
  }

  // A DLPack capsule over the buffer; versioned (1.0, writable) when the consumer asks for
  // max_version >= 1, else the unversioned form. The capsule owns a reference to the buffer.
  py::capsule Dlpack(bool versioned) const {
    const DLDevice device = DlDevice(buffer());  // throws if closed
    struct Context {
      std::shared_ptr<ipc::SharedBuffer> buffer;
      std::vector<int64_t> shape;
      DLManagedTensor legacy;
      DLManagedTensorVersioned current;
    };
    auto* ctx = new Context{buffer_, shape_, {}, {}};
    DLTensor& t = versioned ? ctx->current.dl_tensor : ctx->legacy.dl_tensor;
    t.data = ctx->buffer->data();
    t.device = device;
    t.ndim = static_cast<int32_t>(ctx->shape.size());
    t.dtype = ToDL(dtype_);
    t.shape = ctx->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    if (versioned) {
      ctx->current.version = {1, 0};
      ctx->current.manager_ctx = ctx;
      ctx->current.flags = 0;  // writable, not a copy
      ctx->current.deleter = [](DLManagedTensorVersioned* m) {
        delete static_cast<Context*>(m->manager_ctx);
      };
      return py::capsule(&ctx->current, "dltensor_versioned", [](PyObject* capsule) {
        if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {  // not consumed
          auto* m = static_cast<DLManagedTensorVersioned*>(
              PyCapsule_GetPointer(capsule, "dltensor_versioned"));
          if (m != nullptr && m->deleter != nullptr) m->deleter(m);
        }
      });
    }
    ctx->legacy.manager_ctx = ctx;
    ctx->legacy.deleter = [](DLManagedTensor* m) { delete static_cast<Context*>(m->manager_ctx); };
    return py::capsule(&ctx->legacy, "dltensor", [](PyObject* capsule) {
      if (PyCapsule_IsValid(capsule, "dltensor")) {  // not consumed (a reader renames it)
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        if (m != nullptr && m->deleter != nullptr) m->deleter(m);
      }
    });
  }

 private:
  std::shared_ptr<ipc::SharedBuffer> buffer_;
  DType dtype_;
  std::vector<int64_t> shape_;
};

py::object SetDataIpc(py::handle tmp_input, const std::string& shm_name) {
  ArgScope args;
  const TensorRef ref = args.Convert(tmp_input, "tmp_input");
  std::shared_ptr<ipc::SharedBuffer> buffer = SetDataIpc(ref, shm_name);
  if (!buffer) return py::none();
  return py::cast(SharedTensor(std::move(buffer), ref.dtype, ref.shape));
}

// `shape` as int64 dimensions: a sequence of Python ints (any size: out-of-range values
// are an error naming the op and the argument, not a pybind TypeError).
std::vector<int64_t> ShapeArg(const char* op, py::handle shape) {
  auto fail = [&](const std::string& why) {
    throw Error(std::string(op) + ": `shape` " + why + ", got " +
                py::repr(shape).cast<std::string>());
  };
  if (!py::isinstance<py::sequence>(shape) || py::isinstance<py::str>(shape)) {
    fail("must be a sequence of ints");
  }
  std::vector<int64_t> dims;
  for (py::handle d : shape) {
    if (py::isinstance<py::bool_>(d) || !PyIndex_Check(d.ptr())) fail("must hold ints");
    const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(d.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0) fail("has a dimension outside int64");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    dims.push_back(static_cast<int64_t>(v));
  }
  return dims;
}

SharedTensor ShareExternalData(py::handle input, const std::string& shm_name, py::handle shape,
                               bool use_ipc) {
  ArgScope args;
  const TensorRef ref = args.Convert(input, "input");
  std::vector<int64_t> dims = ShapeArg("share_external_data", shape);
  return SharedTensor(ShareExternalData(ref, shm_name, dims, use_ipc), ref.dtype, dims);
}

#if defined(FDMTP_XPU_EMULATOR)
// Emulated XPU device memory (xpu_malloc of the emulated XRE), freed with its last owner.
class EmulatedDeviceMemory : public ipc::SharedBuffer {
 public:
  explicit EmulatedDeviceMemory(size_t bytes) {
    if (xpu::Malloc(bytes, &data_) != xpu::kSuccess)
      throw Error("xpu_emu_empty: " + xpu::LastError());
    bytes_ = bytes;
    device_ = Device::kXPU;
  }
  ~EmulatedDeviceMemory() override { xpu::Free(data_); }
};

SharedTensor XpuEmuEmpty(py::handle shape_arg, const std::string& dtype) {
  const std::vector<int64_t> shape = ShapeArg("xpu_emu_empty", shape_arg);
  for (DType d :
       {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kUInt8}) {
    if (dtype != DTypeName(d)) continue;
    int64_t count = 1;
    for (int64_t n : shape) {
      if (n < 0)
        throw Error("xpu_emu_empty: `shape` has a negative dimension " + std::to_string(n));
    }
    for (int64_t n : shape) {
      if (n != 0 && count > kMaxElements / n)
        throw Error("xpu_emu_empty: `shape` has more than 2^56 elements");
      count *= n;
    }
    const size_t bytes = static_cast<size_t>(count) * static_cast<size_t>(ToDL(d).bits / 8);
    return SharedTensor(std::make_shared<EmulatedDeviceMemory>(bytes), d, shape);
  }
  throw Error("xpu_emu_empty: `dtype` '" + dtype +
              "' is not float32, float16, bfloat16, int8 or uint8");
}
#endif

void UnsetDataIpc(py::handle tmp_input, const std::string& shm_name, bool close_ipc,
                  bool unlink_shm) {
  TensorRef ref;
  ref.name = "tmp_input";
  UnsetDataIpc(ref, shm_name, unlink_shm);
  if (close_ipc && py::isinstance<SharedTensor>(tmp_input)) tmp_input.cast<SharedTensor&>().close();
}

}  // namespace

void DefineIpc(py::module_& m) {
  py::class_<SharedTensor>(m, "SharedTensor",
                           "Memory shared by name (see fastdeploy_mtp.ops.share_external_data); "
                           "export it with numpy/torch/cupy .from_dlpack (zero-copy).")
      .def_property_readonly("data_ptr", &SharedTensor::data_ptr)
      .def_property_readonly("nbytes", &SharedTensor::nbytes)
      .def_property_readonly("dtype", &SharedTensor::dtype)
      .def_property_readonly("shape", &SharedTensor::shape)
      .def_property_readonly("device", &SharedTensor::device)
      .def_property_readonly("closed", &SharedTensor::closed)
      .def("close", &SharedTensor::close,
           "Drop this object's reference; DLPack views keep the memory until they are gone.")
      .def("__dlpack_device__", &SharedTensor::DlpackDevice)
      .def(
          "__dlpack__",
          [](const SharedTensor& self, py::kwargs kwargs) {
            bool versioned = false;
            if (kwargs.contains("max_version") && !kwargs["max_version"].is_none()) {
              versioned = py::cast<py::tuple>(kwargs["max_version"])[0].cast<int>() >= 1;
            }
            return self.Dlpack(versioned);
          },
          "DLPack capsule (versioned when max_version >= 1); synchronise CUDA work yourself.");
  m.def("set_data_ipc", &SetDataIpc, py::arg("tmp_input"), py::arg("shm_name"),
        "See fastdeploy_mtp.ops.set_data_ipc. CUDA: exports the handle, returns None. Host: a "
        "numpy array's storage cannot be moved, so the contents are copied into the segment "
        "and a SharedTensor over it is returned; use it instead of the array.");
  m.def("share_external_data", &ShareExternalData, py::arg("input"), py::arg("shm_name"),
        py::arg("shape"), py::arg("use_ipc") = true,
        "See fastdeploy_mtp.ops.share_external_data; returns a SharedTensor. use_ipc "
        "(upstream's XPU attr): False reuses an XPU segment's stored device pointer, in the "
        "creator's process only.");
#if defined(FDMTP_XPU_EMULATOR)
  m.def("xpu_emu_empty", &XpuEmuEmpty, py::arg("shape"), py::arg("dtype"),
        "Emulated XPU device memory (zeroed), as a SharedTensor on 'xpu:0' that exports as a "
        "CPU DLPack array. Inside xpu_emulation, set_data_ipc shares it by IPC handle like a "
        "Kunlun device tensor; it is freed when the SharedTensor and its views are gone.");
#endif
  m.def("unset_data_ipc", &UnsetDataIpc, py::arg("tmp_input"), py::arg("shm_name"),
        py::arg("close_ipc"), py::arg("unlink_shm"),
        "See fastdeploy_mtp.ops.unset_data_ipc; close_ipc closes a SharedTensor.");
}

}  // namespace pybind
}  // namespace fdmtp
