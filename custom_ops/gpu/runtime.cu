#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {
__global__ void EmptyKernel() {}
}  // namespace

int DeviceCount(int* count) {
  *count = 0;
  FDMTP_CUDA_CALL(cudaGetDeviceCount(count));
  return cudaSuccess;
}

int Probe(Stream stream) {
  EmptyKernel<<<1, 1, 0, AsCudaStream(stream)>>>();
  FDMTP_CUDA_CALL(cudaGetLastError());
  FDMTP_CUDA_CALL(cudaStreamSynchronize(AsCudaStream(stream)));
  return cudaSuccess;
}

const char* ErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
const char* ErrorName(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

int MallocAsync(void** ptr, size_t bytes, Stream stream) {
  *ptr = nullptr;
  FDMTP_CUDA_CALL(cudaMallocAsync(ptr, bytes, AsCudaStream(stream)));
  return cudaSuccess;
}

int FreeAsync(void* ptr, Stream stream) {
  FDMTP_CUDA_CALL(cudaFreeAsync(ptr, AsCudaStream(stream)));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp
