// CUDA runtime queries and memory calls for host code without CUDA headers (gpu/runtime.cu,
// gpu/cuda_ipc.cu); the per-op launchers are declared in the generated fdmtp/kernels.h.
// Every function returns the cudaError_t as an int (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fdmtp {
namespace cuda {

using Stream = void*;  // cudaStream_t

// The n-gram ops need NgramWorkspaceBytes(bsz) bytes of device scratch, provided by the
// caller and usable by work on `stream` (the launchers never allocate).
size_t NgramWorkspaceBytes(int64_t bsz);

int DeviceCount(int* count);        // cudaGetDeviceCount
int Probe(Stream stream);           // launches an empty kernel: tells whether launches work here
const char* ErrorString(int code);  // cudaGetErrorString
const char* ErrorName(int code);    // cudaGetErrorName
// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the device's default
// pool): for bindings that provide an op's scratch and have no allocator of their own.
int MallocAsync(void** ptr, size_t bytes, Stream stream);
int FreeAsync(void* ptr, Stream stream);
// CUDA IPC (set_data_ipc / share_external_data; gpu/cuda_ipc.cu). `handle` is the 64-byte
// cudaIpcMemHandle_t. GetMemHandle exports the allocation that contains `ptr` and returns
// ptr's byte offset in it; OpenMemHandle maps an exported allocation on `device` (it must
// come from another process) and returns its base; CloseMemHandle unmaps that base.
int IpcGetMemHandle(const void* ptr, void* handle, uint64_t* offset);
int IpcOpenMemHandle(const void* handle, int device, void** base);
int IpcCloseMemHandle(void* base);

}  // namespace cuda
}  // namespace fdmtp
