// The CUDA emulator's runtime: the scheduler of a launch's threads, the lock-step warp
// intrinsics, barriers, and the access checks behind cuda_emu.h (see there for the model).
// This unit is not instrumented; the kernels' loads and stores reach OnAccess through
// emu_common/access_hooks.h.
#include "cuda_emu.h"

#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "emu_common/access_hooks.h"
#include "emu_common/coroutine.h"

namespace cuda_emu_rt {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kStackBytes = 128 * 1024;  // per emulated thread (virtual; touched pages only)
constexpr size_t kDefaultDynamicSmem = 48 * 1024;  // without cudaFuncSetAttribute
constexpr size_t kMaxDynamicSmem = 227 * 1024;     // the most a kernel can opt in to
constexpr uint16_t kAtomicWriter = 0xffff;
constexpr uint16_t kManyReaders = 0xfffe;

struct Fault {
  std::string message;
};

enum class State { kReady, kBarrier, kWarp, kDone };

struct Thread {
  ucontext_t context;
  State state = State::kReady;
  Dim3 idx;
  unsigned tid = 0;
  char* stack = nullptr;
  // barrier
  BarrierOp barrier_op = BarrierOp::kSync;
  int predicate = 0;
  int barrier_result = 0;
  // warp intrinsic
  WarpOp warp_op = WarpOp::kSyncWarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  const char* warp_name = "";
  uint64_t warp_result = 0;
};

// Per-byte state of shared memory for the race check.
struct Shadow {
  uint32_t write_epoch = 0;
  uint32_t read_epoch = 0;
  uint16_t writer = 0;
  uint16_t reader = 0;
};

struct Segment {
  uintptr_t begin, end;
};

// The library's own segments: writable data (shared memory: the kernels' `__shared__`
// statics), read-only data (constants a kernel may read). Found once.
struct Image {
  std::vector<Segment> writable;
  std::vector<Segment> readonly;
};

int PhdrCallback(dl_phdr_info* info, size_t, void* data) {
  auto* image = static_cast<Image*>(data);
  const uintptr_t self = reinterpret_cast<uintptr_t>(&PhdrCallback);
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && self >= lo && self < lo + ph.p_memsz) mine = true;
  }
  if (!mine) return 0;
  Segment relro{0, 0};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_GNU_RELRO) {
      relro = {info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz};
    }
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    Segment s{info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz};
    if ((ph.p_flags & PF_W) == 0) {
      image->readonly.push_back(s);
      continue;
    }
    // Relocated read-only data (vtables, the GOT) sits at the start of the writable
    // segment: read-only for the kernels, not shared memory.
    if (relro.end > s.begin && relro.begin < s.end) {
      image->readonly.push_back({std::max(s.begin, relro.begin), std::min(s.end, relro.end)});
      if (relro.end < s.end) image->writable.push_back({relro.end, s.end});
      if (relro.begin > s.begin) image->writable.push_back({s.begin, relro.begin});
    } else {
      image->writable.push_back(s);
    }
  }
  return 1;
}

const Image& OwnImage() {
  static const Image image = [] {
    Image im;
    dl_iterate_phdr(PhdrCallback, &im);
    return im;
  }();
  return image;
}

struct LaunchState {
  std::string kernel;
  Dim3 grid, block;
  Dim3 block_idx;
  unsigned threads = 0;
  std::vector<Thread> thread;
  int current = -1;  // the running thread, -1 in the scheduler
  ucontext_t scheduler;
  void (*entry)(void*) = nullptr;
  void* params = nullptr;
  size_t params_bytes = 0;
  char* dynamic_smem = nullptr;
  size_t dynamic_bytes = 0;
  uint32_t epoch = 0;        // advances at every barrier and block start
  uint32_t block_epoch = 0;  // the epoch the running block started in
  std::string fault;
};

// Process-wide emulator state: launches are serialised (shared memory is static storage).
std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}
LaunchState* g_launch = nullptr;
char* g_stacks = nullptr;  // kMaxThreadsPerBlock stacks, mapped once
std::vector<Shadow> g_shadow;
// The threads' states, kept between launches (capacity kMaxThreadsPerBlock): a launch
// allocates nothing it could fail to get, even where little memory is left.
std::vector<Thread> g_thread_pool;
std::vector<char> g_dynamic(kMaxDynamicSmem);
uint32_t g_epoch = 0;
int64_t g_launches = 0;
std::vector<std::pair<const void*, size_t>> g_opt_in;  // kernel -> dynamic smem allowed

thread_local int t_shape = -1;
thread_local std::vector<Range> t_ranges;
thread_local int t_last_code = 0;
thread_local std::string t_last_message;

std::string DimString(Dim3 d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

[[noreturn]] void Throw(const std::string& message) { throw Fault{message}; }

Thread& Current() {
  if (g_launch == nullptr || g_launch->current < 0) {
    Throw("a CUDA device function was called outside an emulated kernel launch");
  }
  return g_launch->thread[g_launch->current];
}

std::string Who(const Thread& t) {
  return "thread " + DimString(t.idx) + " of block " + DimString(g_launch->block_idx);
}

// Index of `p` in the shadow of shared memory, or -1 when p is not shared memory.
int64_t SharedOffset(uintptr_t p) {
  int64_t base = 0;
  for (const Segment& s : OwnImage().writable) {
    if (p >= s.begin && p < s.end) return base + static_cast<int64_t>(p - s.begin);
    base += static_cast<int64_t>(s.end - s.begin);
  }
  // The running launch's dynamic shared memory: the bytes it asked for, no more.
  const uintptr_t dyn = reinterpret_cast<uintptr_t>(g_dynamic.data());
  const size_t dyn_bytes = g_launch != nullptr ? g_launch->dynamic_bytes : 0;
  if (p >= dyn && p < dyn + dyn_bytes) return base + static_cast<int64_t>(p - dyn);
  return -1;
}

size_t SharedShadowSize() {
  size_t n = g_dynamic.size();
  for (const Segment& s : OwnImage().writable) n += s.end - s.begin;
  return n;
}

std::string SharedName(uintptr_t p) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shared memory at %p", reinterpret_cast<void*>(p));
  return buf;
}

std::string ThreadName(uint16_t tid) {
  const Dim3& b = g_launch->block;
  const unsigned x = tid % b.x, y = (tid / b.x) % b.y, z = tid / (b.x * b.y);
  return "thread " + DimString(Dim3(x, y, z));
}

// The race and initialisation check of one byte of shared memory: `p`, at `off` in the
// shadow (SharedOffset(p)).
void CheckShared(const Thread& t, uintptr_t p, int64_t off, bool is_write, bool atomic) {
  LaunchState& L = *g_launch;
  Shadow& s = g_shadow[static_cast<size_t>(off)];
  const uint16_t me = static_cast<uint16_t>(t.tid);
  const uint32_t e = L.epoch;
  const char* what = atomic ? "an atomic on" : (is_write ? "writes" : "reads");
  if (!is_write && !atomic && s.write_epoch < L.block_epoch) {
    Throw(Who(t) + " reads " + SharedName(p) +
          " that no thread of the block has written (uninitialised shared memory)");
  }
  if (s.write_epoch == e && s.writer != me && !(atomic && s.writer == kAtomicWriter)) {
    const std::string other = s.writer == kAtomicWriter ? "an atomic" : ThreadName(s.writer);
    Throw("shared-memory race: " + Who(t) + " " + what + " " + SharedName(p) + " which " + other +
          " wrote with no __syncthreads() between");
  }
  if ((is_write || atomic) && s.read_epoch == e && (s.reader == kManyReaders || s.reader != me)) {
    const std::string other = s.reader == kManyReaders ? "other threads" : ThreadName(s.reader);
    Throw("shared-memory race: " + Who(t) + " " + what + " " + SharedName(p) + " which " + other +
          " read with no __syncthreads() between");
  }
  if (is_write || atomic) {
    s.write_epoch = e;
    s.writer = atomic ? kAtomicWriter : me;
  } else if (s.read_epoch != e) {
    s.read_epoch = e;
    s.reader = me;
  } else if (s.reader != me) {
    s.reader = kManyReaders;
  }
}

bool Within(uintptr_t p, size_t bytes, uintptr_t begin, size_t size) {
  return p >= begin && p + bytes <= begin + size && p + bytes >= p;
}

std::string AccessString(uintptr_t p, size_t bytes, bool is_write) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s %zu byte(s) at %p", is_write ? "writes" : "reads", bytes,
                reinterpret_cast<void*>(p));
  return buf;
}

void CheckAccess(uintptr_t p, size_t bytes, bool is_write, bool atomic) {
  LaunchState& L = *g_launch;
  const Thread& t = L.thread[L.current];
  const uintptr_t stack = reinterpret_cast<uintptr_t>(t.stack);
  if (!atomic && Within(p, bytes, stack, kStackBytes)) return;  // the thread's own locals
  const int64_t off = SharedOffset(p);
  if (off >= 0) {
    // One segment holds the whole access (its last byte is at the matching offset).
    if (SharedOffset(p + bytes - 1) != off + static_cast<int64_t>(bytes) - 1) {
      Throw(Who(t) + " " + AccessString(p, bytes, is_write) + " past the end of shared memory");
    }
    for (size_t i = 0; i < bytes; ++i) {
      CheckShared(t, p + i, off + static_cast<int64_t>(i), is_write, atomic);
    }
    return;
  }
  if (!is_write && Within(p, bytes, reinterpret_cast<uintptr_t>(L.params), L.params_bytes)) return;
  for (const Range& r : t_ranges) {
    if (Within(p, bytes, reinterpret_cast<uintptr_t>(r.begin), r.bytes)) return;
  }
  if (!is_write) {
    for (const Segment& s : OwnImage().readonly) {
      if (p >= s.begin && p + bytes <= s.end) return;  // the library's constants
    }
  }
  const uintptr_t stacks = reinterpret_cast<uintptr_t>(g_stacks);
  if (Within(p, bytes, stacks, kStackBytes * kMaxThreadsPerBlock)) {
    Throw(Who(t) + " " + AccessString(p, bytes, is_write) +
          " in another thread's local memory (its stack)");
  }
  Throw(Who(t) + " " + AccessString(p, bytes, is_write) +
        ", outside every tensor of the launch (out of bounds)");
}

void OnAccess(const void* addr, size_t bytes, bool is_write) {
  if (g_launch == nullptr || g_launch->current < 0 || bytes == 0) return;
  CheckAccess(reinterpret_cast<uintptr_t>(addr), bytes, is_write, false);
}

void ThreadMain() {
  LaunchState& L = *g_launch;
  Thread& t = L.thread[L.current];
  try {
    L.entry(L.params);
  } catch (const Fault& f) {
    if (L.fault.empty()) L.fault = f.message;
  }
  t.state = State::kDone;
  // returning resumes uc_link: the scheduler
}

void Yield(Thread& t) { swapcontext(&t.context, &g_launch->scheduler); }

// Resolves the warp intrinsics every waiting lane of some warp has reached; returns true if
// any lane can run again. Faults on a mask that omits a caller or names a lane not there.
bool ResolveWarps() {
  LaunchState& L = *g_launch;
  bool progressed = false;
  const unsigned warps = (L.threads + 31) / 32;
  for (unsigned w = 0; w < warps; ++w) {
    const unsigned first = w * 32;
    const unsigned lanes = std::min(32u, L.threads - first);
    for (unsigned lane = 0; lane < lanes; ++lane) {
      Thread& t = L.thread[first + lane];
      if (t.state != State::kWarp) continue;
      char mask_hex[16];
      std::snprintf(mask_hex, sizeof(mask_hex), "0x%08x", t.mask);
      if (((t.mask >> lane) & 1u) == 0) {
        Throw(Who(t) + " (lane " + std::to_string(lane) + ") calls " + t.warp_name + " with mask " +
              mask_hex + ", which omits it");
      }
      if (t.width < 1 || t.width > 32 || (t.width & (t.width - 1)) != 0) {
        Throw(Who(t) + " calls " + t.warp_name + " with width " + std::to_string(t.width) +
              " (a power of two <= 32)");
      }
      for (unsigned k = 0; k < 32; ++k) {
        if (((t.mask >> k) & 1u) == 0) continue;
        std::string why;
        if (k >= lanes) {
          why = "which does not exist (the block has " + std::to_string(L.threads) + " threads)";
        } else {
          const Thread& o = L.thread[first + k];
          if (o.state == State::kDone) {
            why = "which has exited";
          } else if (o.state == State::kBarrier) {
            why = "which waits at __syncthreads()";
          } else if (o.state == State::kWarp &&
                     (o.mask != t.mask || o.warp_op != t.warp_op || o.width != t.width)) {
            why = std::string("which is in ") + o.warp_name + " with another mask or width";
          }
        }
        if (!why.empty()) {
          Throw(Who(t) + " calls " + t.warp_name + " with mask " + mask_hex + " naming lane " +
                std::to_string(k) + ", " + why);
        }
      }
    }
    // Every waiting lane's mask is complete and consistent: compute the results.
    for (unsigned lane = 0; lane < lanes; ++lane) {
      Thread& t = L.thread[first + lane];
      if (t.state != State::kWarp) continue;
      const unsigned seg = lane & ~static_cast<unsigned>(t.width - 1);
      auto from = [&](int src) -> uint64_t {
        if (src < static_cast<int>(seg) || src >= static_cast<int>(seg) + t.width) return t.value;
        if (((t.mask >> src) & 1u) == 0) {
          Throw(Who(t) + " " + t.warp_name + " reads lane " + std::to_string(src) +
                ", which is not in its mask");
        }
        return L.thread[first + static_cast<unsigned>(src)].value;
      };
      uint64_t r = 0;
      switch (t.warp_op) {
        case WarpOp::kShflIdx: r = from(static_cast<int>(seg) + (t.arg & (t.width - 1))); break;
        case WarpOp::kShflUp: r = from(static_cast<int>(lane) - t.arg); break;
        case WarpOp::kShflDown: r = from(static_cast<int>(lane) + t.arg); break;
        case WarpOp::kShflXor:
          r = from(static_cast<int>(lane ^ static_cast<unsigned>(t.arg)));
          break;
        case WarpOp::kBallot:
        case WarpOp::kAny:
        case WarpOp::kAll: {
          uint64_t ballot = 0;
          for (unsigned k = 0; k < lanes; ++k) {
            if (((t.mask >> k) & 1u) && L.thread[first + k].value != 0) ballot |= 1ull << k;
          }
          r = t.warp_op == WarpOp::kBallot ? ballot
              : t.warp_op == WarpOp::kAny
                  ? (ballot != 0)
                  : (ballot == (t.mask & ((lanes == 32) ? 0xffffffffull : ((1ull << lanes) - 1))));
          break;
        }
        case WarpOp::kSyncWarp: break;
      }
      t.warp_result = r;
    }
    for (unsigned lane = 0; lane < lanes; ++lane) {
      Thread& t = L.thread[first + lane];
      if (t.state == State::kWarp) {
        t.state = State::kReady;
        progressed = true;
      }
    }
  }
  return progressed;
}

// Prepares thread i of the block to start the kernel.
void InitThread(LaunchState& L, unsigned i) {
  Thread& t = L.thread[i];
  t = Thread{};
  t.tid = i;
  t.idx = Dim3(i % L.block.x, (i / L.block.x) % L.block.y, i / (L.block.x * L.block.y));
  t.stack = g_stacks + static_cast<size_t>(i) * kStackBytes;
  fdmtp::emu::InitCoroutine(&t.context, t.stack, kStackBytes, &L.scheduler, ThreadMain);
}

// Runs thread i until it waits or finishes. (Out of RunBlock's loops: swapcontext returns
// twice as far as the compiler knows, which would put the loop variables at risk.)
__attribute__((noinline)) void Resume(LaunchState& L, unsigned i) {
  L.current = static_cast<int>(i);
  swapcontext(&L.scheduler, &L.thread[i].context);
  L.current = -1;
}

void RunBlock() {
  LaunchState& L = *g_launch;
  L.block_epoch = L.epoch = ++g_epoch;
  for (unsigned i = 0; i < L.threads; ++i) InitThread(L, i);
  for (;;) {
    bool ran = true;
    while (ran && L.fault.empty()) {
      ran = false;
      for (unsigned i = 0; i < L.threads && L.fault.empty(); ++i) {
        if (L.thread[i].state != State::kReady) continue;
        Resume(L, i);
        ran = true;
      }
    }
    if (!L.fault.empty()) return;
    try {
      if (ResolveWarps()) continue;
    } catch (const Fault& f) {
      L.fault = f.message;
      return;
    }
    unsigned at_barrier = 0, done = 0;
    for (const Thread& t : L.thread) {
      at_barrier += t.state == State::kBarrier ? 1 : 0;
      done += t.state == State::kDone ? 1 : 0;
    }
    if (done == L.threads) return;
    if (done > 0) {
      L.fault = "block " + DimString(L.block_idx) + ": " + std::to_string(at_barrier) +
                " thread(s) wait at __syncthreads() which " + std::to_string(done) +
                " thread(s) of the block never reach (they exited): a barrier not reached by "
                "every thread";
      return;
    }
    // Every thread waits at a barrier: release it.
    BarrierOp op = L.thread[0].barrier_op;
    int count = 0;
    for (const Thread& t : L.thread) {
      if (t.barrier_op != op) {
        L.fault = "block " + DimString(L.block_idx) +
                  ": threads wait at different kinds of __syncthreads (plain, _or, _and, _count)";
        return;
      }
      count += t.predicate != 0 ? 1 : 0;
    }
    int result = 0;
    switch (op) {
      case BarrierOp::kSync: break;
      case BarrierOp::kOr: result = count > 0; break;
      case BarrierOp::kAnd: result = count == static_cast<int>(L.threads); break;
      case BarrierOp::kCount: result = count; break;
    }
    L.epoch = ++g_epoch;
    for (Thread& t : L.thread) {
      t.barrier_result = result;
      t.state = State::kReady;
    }
  }
}

int Fail(int code, const std::string& message) {
  t_last_code = code;
  t_last_message = message;
  return code;
}

}  // namespace

Dim3 ThreadIdx() { return Current().idx; }
Dim3 BlockIdx() {
  Current();
  return g_launch->block_idx;
}
Dim3 BlockDim() {
  Current();
  return g_launch->block;
}
Dim3 GridDim() {
  Current();
  return g_launch->grid;
}

int Barrier(BarrierOp op, int predicate) {
  Thread& t = Current();
  t.state = State::kBarrier;
  t.barrier_op = op;
  t.predicate = predicate;
  Yield(t);
  return t.barrier_result;
}

uint64_t Warp(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* name) {
  Thread& t = Current();
  t.state = State::kWarp;
  t.warp_op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.warp_name = name;
  Yield(t);
  return t.warp_result;
}

namespace {

template <typename T>
T ApplyAtomic(AtomicOp op, T old, T value, T compare) {
  switch (op) {
    case AtomicOp::kAdd: return static_cast<T>(old + value);
    case AtomicOp::kSub: return static_cast<T>(old - value);
    case AtomicOp::kMax: return old < value ? value : old;
    case AtomicOp::kMin: return value < old ? value : old;
    case AtomicOp::kExch: return value;
    case AtomicOp::kCas: return old == compare ? value : old;
    case AtomicOp::kOr:
    case AtomicOp::kAnd: break;
  }
  if constexpr (std::is_integral_v<T>) return op == AtomicOp::kOr ? (old | value) : (old & value);
  Throw("atomicOr / atomicAnd take integers");
}

template <typename T>
uint64_t AtomicAs(AtomicOp op, void* addr, uint64_t value, uint64_t compare) {
  T old, v, c;
  std::memcpy(&old, addr, sizeof(T));
  std::memcpy(&v, &value, sizeof(T));
  std::memcpy(&c, &compare, sizeof(T));
  const T result = ApplyAtomic(op, old, v, c);
  std::memcpy(addr, &result, sizeof(T));
  uint64_t bits = 0;
  std::memcpy(&bits, &old, sizeof(T));
  return bits;
}

}  // namespace

uint64_t Atomic(AtomicOp op, AtomicType type, void* addr, size_t bytes, uint64_t value,
                uint64_t compare) {
  Current();
  CheckAccess(reinterpret_cast<uintptr_t>(addr), bytes, true, true);
  if (type == AtomicType::kF32) return AtomicAs<float>(op, addr, value, compare);
  if (bytes == 4) {
    return type == AtomicType::kSigned ? AtomicAs<int32_t>(op, addr, value, compare)
                                       : AtomicAs<uint32_t>(op, addr, value, compare);
  }
  return type == AtomicType::kSigned ? AtomicAs<int64_t>(op, addr, value, compare)
                                     : AtomicAs<uint64_t>(op, addr, value, compare);
}

void* DynamicShared() {
  Current();
  return g_launch->dynamic_smem;
}

int Memset(void* ptr, int value, size_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (const Range& r : t_ranges) {
    if (Within(p, bytes, reinterpret_cast<uintptr_t>(r.begin), r.bytes)) {
      std::memset(ptr, value, bytes);
      return 0;
    }
  }
  return Fail(cudaErrorInvalidValue, "cudaMemsetAsync (emulated): " + std::to_string(bytes) +
                                         " bytes are outside every tensor of the op");
}

const char* KernelName(const char* pretty) {
  static thread_local std::string name;
  name = pretty;
  const size_t at = name.find("Kernel = ");
  if (at != std::string::npos) {
    name = name.substr(at + 9);
    const size_t end = name.find_first_of(";]");
    if (end != std::string::npos) name = name.substr(0, end);
  }
  // The emulated units rename the package namespace; report the source's name.
  const std::string renamed = "fdmtp_cudaemu::";
  for (size_t i = name.find(renamed); i != std::string::npos; i = name.find(renamed)) {
    name.replace(i, renamed.size(), "fdmtp::");
  }
  return name.c_str();
}

int SetMaxDynamicSharedMemory(const void* kernel_id, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > kMaxDynamicSmem) {
    return Fail(cudaErrorInvalidValue, "cudaFuncSetAttribute (emulated): " + std::to_string(bytes) +
                                           " bytes of dynamic shared memory (at most " +
                                           std::to_string(kMaxDynamicSmem) + ")");
  }
  std::lock_guard<std::mutex> lock(LaunchMutex());
  for (auto& entry : g_opt_in) {
    if (entry.first == kernel_id) {
      entry.second = static_cast<size_t>(bytes);
      return 0;
    }
  }
  g_opt_in.emplace_back(kernel_id, static_cast<size_t>(bytes));
  return 0;
}

int Launch(const char* kernel, const void* kernel_id, Dim3 grid, Dim3 block, size_t dynamic_smem,
           void (*entry)(void*), void* params, size_t params_bytes, int flags) {
  if (t_shape == 1) {
    if ((flags & kFixedBlock) == 0 && block.x > kSmallBlock) block.x = kSmallBlock;
    if (grid.x > kSmallGrid) grid.x = kSmallGrid;
  }
  const std::string name = std::string("CUDA kernel ") + kernel + " (emulated) <<<" +
                           DimString(grid) + ", " + DimString(block) + ">>>: ";
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      threads > kMaxThreadsPerBlock || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    return Fail(cudaErrorInvalidConfiguration,
                name +
                    "invalid launch shape (every dimension >= 1, at most 1024 threads per "
                    "block, block <= (1024, 1024, 64), grid <= (2^31 - 1, 65535, 65535))");
  }
  std::lock_guard<std::mutex> lock(LaunchMutex());
  size_t allowed = kDefaultDynamicSmem;
  for (const auto& opt : g_opt_in) {
    if (opt.first == kernel_id) allowed = std::max(allowed, opt.second);
  }
  if (dynamic_smem > allowed) {
    return Fail(cudaErrorInvalidValue,
                name + std::to_string(dynamic_smem) +
                    " bytes of dynamic shared memory exceed the " + std::to_string(allowed) +
                    " this kernel may use (48 KB unless raised with cudaFuncSetAttribute)");
  }
  if (g_stacks == nullptr) {
    void* m = mmap(nullptr, kStackBytes * kMaxThreadsPerBlock, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return Fail(cudaErrorLaunchFailure, name + "cannot map thread stacks");
    g_stacks = static_cast<char*>(m);
    g_shadow.resize(SharedShadowSize());
    g_thread_pool.reserve(kMaxThreadsPerBlock);
  }
  ++g_launches;
  LaunchState L;
  L.kernel = kernel;
  L.grid = grid;
  L.block = block;
  L.threads = static_cast<unsigned>(threads);
  L.thread = std::move(g_thread_pool);
  L.thread.resize(L.threads);  // within the reserved capacity
  L.entry = entry;
  L.params = params;
  L.params_bytes = params_bytes;
  L.dynamic_smem = g_dynamic.data();
  L.dynamic_bytes = dynamic_smem;
  g_launch = &L;
  const fdmtp::emu::AccessHook previous = fdmtp::emu::SetAccessHook(&OnAccess);
  for (unsigned z = 0; z < grid.z && L.fault.empty(); ++z) {
    for (unsigned y = 0; y < grid.y && L.fault.empty(); ++y) {
      for (unsigned x = 0; x < grid.x && L.fault.empty(); ++x) {
        L.block_idx = Dim3(x, y, z);
        RunBlock();
      }
    }
  }
  fdmtp::emu::SetAccessHook(previous);
  g_launch = nullptr;
  g_thread_pool = std::move(L.thread);
  if (!L.fault.empty()) return Fail(cudaErrorLaunchFailure, name + L.fault);
  return 0;
}

int LastLaunchError() {
  const int code = t_last_code;
  t_last_code = 0;
  return code;
}

const char* LastMessage() { return t_last_message.c_str(); }

void ClearLastError() {
  t_last_code = 0;
  t_last_message.clear();
}

RangeScope::RangeScope(const void* begin, size_t bytes) { t_ranges.push_back({begin, bytes}); }
RangeScope::~RangeScope() { t_ranges.pop_back(); }

Scope::Scope(int shape) : previous_(t_shape) {
  t_shape = shape;
  ClearLastError();
}
Scope::~Scope() { t_shape = previous_; }

int ActiveShape() { return t_shape; }

int64_t LaunchCount() {
  std::lock_guard<std::mutex> lock(LaunchMutex());
  return g_launches;
}

}  // namespace cuda_emu_rt
