// Declarations of the backend kernels, framework-free: argument structs in, no
// framework types. Includers need no CUDA headers.
//
//   fdmtp::cpu::X(args)           runs op X on host memory.
//   fdmtp::cuda::X(args, stream)  launches op X on `stream` (a cudaStream_t, or nullptr for
//                                 the legacy default stream) and returns the cudaError_t
//                                 as an int (0 = success). It never synchronises.
#pragma once

#include <cstddef>

#include "fdmtp/draft_model_postprocess.h"
#include "fdmtp/hybrid_mtp_ngram.h"
#include "fdmtp/ngram_match.h"

namespace fdmtp {

namespace cpu {
void DraftModelPostprocess(const DraftModelPostprocessArgs& args);
// num_threads <= 0: chosen from the amount of work; the result never depends on it.
void HybridMtpNgram(const HybridMtpNgramArgs& args, int num_threads);
void NgramMatch(const NgramMatchArgs& args, int num_threads);
}  // namespace cpu

namespace cuda {
using Stream = void*;  // cudaStream_t

int DraftModelPostprocess(const DraftModelPostprocessArgs& args, Stream stream);
// The n-gram ops need NgramWorkspaceBytes(bsz) bytes of device scratch, provided by the
// caller and usable by work on `stream` (the launchers never allocate).
size_t NgramWorkspaceBytes(int64_t bsz);
int HybridMtpNgram(const HybridMtpNgramArgs& args, void* workspace, Stream stream);
int NgramMatch(const NgramMatchArgs& args, void* workspace, Stream stream);

// Runtime queries, so callers without CUDA headers can report what they see.
int DeviceCount(int* count);      // cudaGetDeviceCount
int Probe(Stream stream);         // launches an empty kernel: tells whether launches work here
const char* ErrorString(int code);  // cudaGetErrorString
const char* ErrorName(int code);    // cudaGetErrorName
// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the device's default
// pool): for bindings that provide an op's scratch and have no allocator of their own.
int MallocAsync(void** ptr, size_t bytes, Stream stream);
int FreeAsync(void* ptr, Stream stream);
}  // namespace cuda

}  // namespace fdmtp
