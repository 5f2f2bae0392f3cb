// CUDA IPC for set_data_ipc / share_external_data (entry/ipc_entries.cc): export, open and close
// memory handles. Host-side runtime calls only; nothing is launched.
#include <cuda.h>

#include <cstring>

#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// cuMemGetAddressRange through the runtime's driver entry point, so the library does not
// link libcuda (it must load on machines without a driver).
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

int AllocationBase(const void* ptr, const void** base) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  FDMTP_CUDA_CALL(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                   cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    return static_cast<int>(cudaErrorSymbolNotFound);
  CUdeviceptr start = 0;
  size_t size = 0;
  const CUresult r =
      reinterpret_cast<GetAddressRangeFn>(fn)(&start, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return static_cast<int>(cudaErrorInvalidValue);
  *base = reinterpret_cast<const void*>(start);
  return static_cast<int>(cudaSuccess);
}

}  // namespace

int IpcGetMemHandle(const void* ptr, void* handle, uint64_t* offset) {
  static_assert(sizeof(cudaIpcMemHandle_t) == 64, "upstream's segment stores 64 handle bytes");
  const void* base = nullptr;
  const int found = AllocationBase(ptr, &base);
  if (found != 0) return found;
  cudaIpcMemHandle_t h;
  FDMTP_CUDA_CALL(cudaIpcGetMemHandle(&h, const_cast<void*>(ptr)));
  std::memcpy(handle, &h, sizeof(h));
  *offset = static_cast<uint64_t>(static_cast<const char*>(ptr) - static_cast<const char*>(base));
  return cudaSuccess;
}

int IpcOpenMemHandle(const void* handle, int device, void** base) {
  *base = nullptr;
  int previous = 0;
  FDMTP_CUDA_CALL(cudaGetDevice(&previous));
  FDMTP_CUDA_CALL(cudaSetDevice(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  const cudaError_t opened = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
  FDMTP_CUDA_CALL(cudaSetDevice(previous));
  return static_cast<int>(opened);
}

int IpcCloseMemHandle(void* base) {
  FDMTP_CUDA_CALL(cudaIpcCloseMemHandle(base));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp
