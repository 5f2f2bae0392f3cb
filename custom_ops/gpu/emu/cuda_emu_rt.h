// The CUDA emulator's runtime interface (gpu/emu/cuda_emu.cc): what the emulated kernels
// call (through the CUDA names cuda_emu.h defines) and what the op entries use to run
// them (the emulation scope, the memory a launch may touch, the last failure). No macros
// here: host code includes this header, kernels include cuda_emu.h.
#pragma once

#include <cstddef>
#include <cstdint>

// The emulator's runtime (gpu/emu/cuda_emu.cc). Its namespace holds no `fdmtp` token, so
// the renamed kernel units and the runtime agree on these names.
namespace cuda_emu_rt {

struct Dim3 {
  unsigned int x, y, z;
  Dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

Dim3 ThreadIdx();
Dim3 BlockIdx();
Dim3 BlockDim();
Dim3 GridDim();

enum class BarrierOp { kSync, kOr, kAnd, kCount };
int Barrier(BarrierOp op, int predicate);

enum class WarpOp { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp };
// One warp intrinsic: blocks until every lane of `mask` has called it, then returns this
// lane's result (the shuffled value's bits, or the vote).
uint64_t Warp(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* name);

// One atomic read-modify-write of the `bytes`-byte value at `addr` (values as bits);
// returns the old value. `addr` is checked like any access and recorded as atomic.
enum class AtomicOp { kAdd, kSub, kMax, kMin, kExch, kOr, kAnd, kCas };
enum class AtomicType { kSigned, kUnsigned, kF32 };
uint64_t Atomic(AtomicOp op, AtomicType type, void* addr, size_t bytes, uint64_t value,
                uint64_t compare);
// Dynamic shared memory of the running block.
void* DynamicShared();
// cudaMemsetAsync on emulated memory (bounds-checked, synchronous).
int Memset(void* ptr, int value, size_t bytes);

// Launch flags.
constexpr int kFixedBlock = 1;  // the kernel needs exactly this block size (see Launch)

// The memory a launch may touch besides its threads' stacks, its parameters and shared
// memory: the op's tensors and scratch, registered by the caller for the duration of a
// RangeScope (nested scopes add to the enclosing ones).
struct Range {
  const void* begin;
  size_t bytes;
};
class RangeScope {
 public:
  RangeScope(const void* begin, size_t bytes);
  ~RangeScope();
  RangeScope(const RangeScope&) = delete;
  RangeScope& operator=(const RangeScope&) = delete;
};

// Emulation on this thread: while a Scope is alive, the ops run their CUDA kernels under the
// emulator on host tensors. shape 0 launches kernels as the launcher asks; shape 1 shrinks
// every block to at most kSmallBlock threads (unless the launch is kFixedBlock) and every
// grid to at most kSmallGrid blocks, so kernels are exercised with grid-stride and chunk
// loops that wrap.
constexpr unsigned kSmallBlock = 64;
constexpr unsigned kSmallGrid = 3;
class Scope {
 public:
  explicit Scope(int shape);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int previous_;
};
// -1 when no Scope is alive on this thread, else its shape.
int ActiveShape();
// Launches run under the emulator so far (in this library), for reports.
int64_t LaunchCount();

// Runs `entry(params)` on every thread of grid x block; 0 or a cudaError_t code, with the
// message in LastError(). `params` ([params_bytes]) holds the kernel's arguments.
int Launch(const char* kernel, const void* kernel_id, Dim3 grid, Dim3 block, size_t dynamic_smem,
           void (*entry)(void*), void* params, size_t params_bytes, int flags);
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): lets
// `kernel_id` launch with up to `bytes` of dynamic shared memory (at most 227 KB, as an
// H100 / H200 block). 0 or cudaErrorInvalidValue.
int SetMaxDynamicSharedMemory(const void* kernel_id, int bytes);
int LastLaunchError();  // cudaGetLastError: the last launch's code, then reset
const char* LastMessage();
void ClearLastError();  // forgets the last code and message (before an op's launches)

}  // namespace cuda_emu_rt

// The emulator's self-test kernels (gpu/emu/selftest_kernels.cu, tests only): runs the one
// named `which` on `out` ([64] int64); 0, a cudaError_t code (LastMessage() says why), or -1
// for an unknown name.
namespace fdmtp_cuda_emulated {
int Selftest(const char* which, int64_t* out);
}  // namespace fdmtp_cuda_emulated
