// fastdeploy_mtp._kernels: the ops without Paddle. Tensors are DLPack objects or raw
// pointer tuples (see tensor_arg.h); CUDA work is launched on `stream` (an integer
// cudaStream_t, 0 = legacy default stream) and is not synchronised.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "fdmtp/ops.h"
#include "generated_ops.h"
#include "ipc_bindings.h"
#include "xpu/plugin.h"

namespace py = pybind11;

namespace {

py::dict BuildInfo() {
  py::dict info;
  info["cuda"] = fdmtp::BuiltWithCuda();
  info["xpu"] = fdmtp::BuiltWithXpu();
  // The XPU3 kernels under the emulator (host tensors, see xpu_emulation).
  info["xpu_emulator"] = !fdmtp::BuiltWithXpu();
#if defined(FDMTP_CUDA_ARCHS_STRING)
  info["cuda_archs"] = FDMTP_CUDA_ARCHS_STRING;
#else
  info["cuda_archs"] = "";
#endif
  return info;
}

// (usable, reason): whether CUDA kernels can be launched in this process.
py::tuple CudaStatus() {
#if defined(FDMTP_WITH_CUDA)
  int count = 0;
  int status = fdmtp::cuda::DeviceCount(&count);
  if (status != 0) {
    return py::make_tuple(false, std::string("no usable CUDA device: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  if (count == 0) return py::make_tuple(false, std::string("no CUDA device found"));
  status = fdmtp::cuda::Probe(nullptr);
  if (status != 0) {
    return py::make_tuple(false, std::string("a test kernel launch failed: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  return py::make_tuple(true, std::to_string(count) + " CUDA device(s)");
#else
  return py::make_tuple(false, std::string("fastdeploy_mtp was built without CUDA kernels"));
#endif
}

// `with _kernels.xpu_emulation(clusters, cores):` runs every op called on host tensors on
// this thread through its XPU3 kernel under the emulator, launched <<<clusters, cores>>>.
class XpuEmulation {
 public:
  XpuEmulation(int clusters, int cores) : clusters_(clusters), cores_(cores) {}
  XpuEmulation& Enter() {
    if (scope_) throw fdmtp::Error("xpu_emulation: this scope is already active");
    scope_ = std::make_unique<fdmtp::xpu::EmulationScope>(clusters_, cores_);
    return *this;
  }
  void Exit(py::handle, py::handle, py::handle) { scope_.reset(); }

 private:
  int clusters_;
  int cores_;
  std::unique_ptr<fdmtp::xpu::EmulationScope> scope_;
};

// Runs one of the emulator's rule-breaking kernels (tests only); raises KernelError with
// the emulator's report.
void XpuEmulatorSelftest(const std::string& which, int clusters, int cores) {
  fdmtp::xpu::Context ctx;
  ctx.clusters = clusters;
  ctx.cores = cores;
  if (fdmtp::xpu::emulator_selftest(&ctx, which) != fdmtp::xpu::kSuccess) {
    throw fdmtp::Error(fdmtp::xpu::LastError());
  }
}

}  // namespace

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "fastdeploy_mtp kernels without Paddle: DLPack or raw-pointer tensors in, in place.";
  // Argument and launch errors: ValueError, with the op and argument named in the message.
  py::register_exception<fdmtp::Error>(m, "KernelError", PyExc_ValueError);
  m.def("build_info", &BuildInfo, "Backends compiled into this module: {cuda, xpu, cuda_archs}.");
  m.def("cuda_status", &CudaStatus,
        "(usable: bool, reason: str): whether CUDA kernels can run in this process.");
  py::class_<XpuEmulation>(m, "xpu_emulation",
                           "Context manager: ops on host tensors run their XPU3 kernels under "
                           "the emulator, launched with <<<clusters, cores>>> (this thread only).")
      .def(py::init<int, int>(), py::arg("clusters"), py::arg("cores"))
      .def("__enter__", &XpuEmulation::Enter, py::return_value_policy::reference)
      .def("__exit__", &XpuEmulation::Exit);
  m.def("_xpu_emulator_selftest", &XpuEmulatorSelftest, py::arg("which"), py::arg("clusters"),
        py::arg("cores"), "Tests only: run a KP-rule-breaking kernel under the emulator.");
  fdmtp::pybind::DefineOps(m);  // every declared op (generated: pybind_ops.cc)
  fdmtp::pybind::DefineIpc(m);  // set_data_ipc, share_external_data, unset_data_ipc
}
