// Kernels with deliberate bugs, for the CUDA emulator's self-tests (tests/ops/
// test_cuda_emulator.py): each must make its launch fail with the emulator's report, and
// the correct ones must run and give the right answer (so the tests cannot pass by every
// launch failing). Compiled only for the emulator.
#include <string>
#include <vector>

#include "../cuda_utils.cuh"

namespace fdmtp {
namespace cuda {
namespace selftest {

constexpr int kThreads = 64;

// Correct: block-wide inclusive scan in shared memory (Hillis-Steele), barriers between
// the reads and the writes of every step.
__global__ void ScanKernel(int64_t* out) {
  __shared__ int64_t s[kThreads];
  const int t = threadIdx.x;
  s[t] = t + 1;
  __syncthreads();
  for (int d = 1; d < kThreads; d <<= 1) {
    const int64_t add = t >= d ? s[t - d] : 0;
    __syncthreads();
    s[t] += add;
    __syncthreads();
  }
  out[t] = s[t];
}

// Bug: the barrier between the write and the neighbour's read is missing.
__global__ void MissingSyncKernel(int64_t* out) {
  __shared__ int64_t s[kThreads];
  const int t = threadIdx.x;
  s[t] = t;
  out[t] = t > 0 ? s[t - 1] : 0;
}

// Bug: an off-by-one bound writes one element past the output.
__global__ void OffByOneKernel(int64_t* out, int n) {
  for (int i = threadIdx.x; i <= n; i += blockDim.x) out[i] = i;
}

// Correct: a warp-level inclusive scan with full-warp shuffles.
__global__ void WarpScanKernel(int64_t* out) {
  int64_t x = threadIdx.x + 1;
  const int lane = threadIdx.x & 31;
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  out[threadIdx.x] = x + __ballot_sync(0xffffffffu, 1) - 0xffffffffu;
}

// Bug: every lane shuffles but the mask names only the low half of the warp.
__global__ void WrongMaskKernel(int64_t* out) {
  const int64_t y = __shfl_up_sync(0x0000ffffu, static_cast<int64_t>(threadIdx.x), 1);
  out[threadIdx.x] = y;
}

// Bug: half of the block returns before a barrier the other half waits at.
__global__ void DivergentBarrierKernel(int64_t* out) {
  if (threadIdx.x >= kThreads / 2) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Bug: shared memory read before any thread wrote it.
__global__ void UninitialisedSharedKernel(int64_t* out) {
  __shared__ int64_t s[kThreads];
  const int t = threadIdx.x;
  out[t] = s[t];
  __syncthreads();
  s[t] = t;  // written, but only after the read
}

// Correct: atomics from every thread on one shared word, read after a barrier.
__global__ void AtomicKernel(int64_t* out) {
  __shared__ unsigned long long best;
  if (threadIdx.x == 0) best = 0;
  __syncthreads();
  atomicMax(&best, static_cast<unsigned long long>(threadIdx.x * 7 % kThreads));
  __syncthreads();
  out[threadIdx.x] = static_cast<int64_t>(best);
}

// Bug: a plain read of the word other threads update atomically in the same phase.
__global__ void AtomicRaceKernel(int64_t* out) {
  __shared__ unsigned long long best;
  if (threadIdx.x == 0) best = 0;
  __syncthreads();
  atomicMax(&best, static_cast<unsigned long long>(threadIdx.x));
  out[threadIdx.x] = static_cast<int64_t>(best);
}

// Correct: a block reduction in dynamic shared memory of `words` int64 (64 KB: needs the
// cudaFuncSetAttribute opt-in above 48 KB).
__global__ void DynamicSharedKernel(int64_t* out, int words) {
  FDMTP_DYNAMIC_SHARED(int64_t, buf);
  for (int i = threadIdx.x; i < words; i += blockDim.x) buf[i] = i;
  __syncthreads();
  int64_t sum = 0;
  for (int i = 0; i < words; ++i) sum += buf[i];
  out[threadIdx.x] = sum;
}

// `which` names one of the kernels above; `out` holds kThreads int64 values. The launch
// shape is fixed except for "invalid_shape" (a block of 2048 threads).
int Run(const std::string& which, int64_t* out) {
  const cuda_emu_rt::RangeScope range(out, sizeof(int64_t) * kThreads);
  const dim3 one(1), block(kThreads);
  if (which == "scan") return LaunchFixedBlock<ScanKernel>(one, block, 0, nullptr, out);
  if (which == "missing_syncthreads") {
    return LaunchFixedBlock<MissingSyncKernel>(one, block, 0, nullptr, out);
  }
  if (which == "off_by_one") {
    return LaunchFixedBlock<OffByOneKernel>(one, block, 0, nullptr, out, kThreads);
  }
  if (which == "warp_scan") return LaunchFixedBlock<WarpScanKernel>(one, block, 0, nullptr, out);
  if (which == "wrong_shuffle_mask") {
    return LaunchFixedBlock<WrongMaskKernel>(one, block, 0, nullptr, out);
  }
  if (which == "divergent_barrier") {
    return LaunchFixedBlock<DivergentBarrierKernel>(one, block, 0, nullptr, out);
  }
  if (which == "uninitialised_shared") {
    return LaunchFixedBlock<UninitialisedSharedKernel>(one, block, 0, nullptr, out);
  }
  if (which == "atomic") return LaunchFixedBlock<AtomicKernel>(one, block, 0, nullptr, out);
  if (which == "atomic_race") {
    return LaunchFixedBlock<AtomicRaceKernel>(one, block, 0, nullptr, out);
  }
  constexpr int kWords = 8192;  // 64 KB
  const size_t dyn = sizeof(int64_t) * kWords;
  if (which == "dynamic_shared_without_opt_in") {
    return LaunchFixedBlock<DynamicSharedKernel>(one, block, dyn, nullptr, out, kWords);
  }
  if (which == "dynamic_shared" || which == "dynamic_shared_overrun") {
    const cudaError_t set = cudaFuncSetAttribute(
        DynamicSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn));
    if (set != cudaSuccess) return set;
    // the overrun launch asks for one word less than the kernel touches
    const size_t asked = which == "dynamic_shared" ? dyn : dyn - sizeof(int64_t);
    return LaunchFixedBlock<DynamicSharedKernel>(one, block, asked, nullptr, out, kWords);
  }
  if (which == "invalid_shape") {
    return LaunchFixedBlock<ScanKernel>(one, dim3(2048), 0, nullptr, out);
  }
  return -1;
}

}  // namespace selftest
}  // namespace cuda
}  // namespace fdmtp

namespace fdmtp_cuda_emulated {

// Runs one self-test kernel (names in fdmtp::cuda::selftest::Run) on `out` ([64] int64):
// 0, a cudaError_t code (cuda_emu_rt::LastMessage() says why), or -1 for an unknown name.
int Selftest(const char* which, int64_t* out) { return ::fdmtp::cuda::selftest::Run(which, out); }

}  // namespace fdmtp_cuda_emulated
