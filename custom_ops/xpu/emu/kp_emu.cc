// The scheduler and checks behind kp_emu.h (see there for the model and its limits).
#include "kp_emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "emu_common/access_hooks.h"
#include "emu_common/coroutine.h"

// The bounds of the shared-memory section (every __shared__ static of the kernel units),
// provided by the linker for each shared object that has one.
extern "C" {
extern char __start_fdmtp_xpu_sm[] __attribute__((weak, visibility("hidden")));
extern char __stop_fdmtp_xpu_sm[] __attribute__((weak, visibility("hidden")));
}

namespace fdmtp_kpemu {
namespace {

namespace lim = ::fdmtp::xpu;

// Stack of one emulated core: its local memory as the kernel sees it, plus the host frames
// of the emulator (coroutine entry, std::function, the argument tuple's apply) and the
// instrumented code's own frame overhead. Bounded by a PROT_NONE guard page below it.
constexpr size_t kCoreStackBytes = 64 * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kSlotBytes = kCoreStackBytes + kGuardBytes;
// What a core may use of its stack: the XPU3 local memory plus this allowance for the host
// frames above (which an XPU core does not have) and g++'s larger frames (spills, alignment,
// the access callbacks' calls). The op kernels peak at about 3.4 KB (FDMTP_XPU_EMU_STATS=1).
constexpr int64_t kHostFrameAllowance = 4 * 1024;
constexpr unsigned char kStackPattern = 0xCD;
// Shared memory is swapped between clusters in blocks of this size.
constexpr size_t kSmBlock = 256;

enum class CoreState { kReady, kAtBarrier, kDone, kFaulted };

struct Core {
  ucontext_t context;
  int cluster = 0;
  int core = 0;
  char* stack = nullptr;  // lowest usable byte
  CoreState state = CoreState::kReady;
  bool sm_dirty = false;  // wrote shared memory since its last mfence()
};

struct ClusterState {
  int arrived = 0;  // cores waiting at sync_cluster()
  int done = 0;
  std::vector<char> sm;  // this cluster's copy of the touched shared-memory blocks
};

struct LaunchState {
  std::string kernel;
  int clusters = 0;
  int cores = 0;
  int running = -1;  // index into `core`, -1 in the scheduler
  int sm_owner = 0;  // the cluster whose shared memory the section holds
  bool interleave_clusters = false;
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  std::vector<Core> core;
  std::vector<ClusterState> cluster;
  std::vector<size_t> sm_touched;  // block indices, in first-touch order
  uint64_t rng = 0;
  int countdown = 0;  // accesses until the next switch
  std::string fault;
};

LaunchState* g_launch = nullptr;  // guarded by LaunchMutex()
// Per-block index into sm_touched + 1 (0: untouched this launch).
std::vector<uint32_t> g_sm_slot;
// The pool of core stacks: one mapping, a guard page below each slot.
char* g_pool = nullptr;
size_t g_pool_slots = 0;
std::vector<size_t> g_pool_dirty;  // per slot: bytes from the top that may hold non-pattern

std::atomic<uint64_t> g_launches{0};
std::atomic<int64_t> g_peak_stack{0};
std::atomic<uint64_t> g_switches{0};

std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}

char* SmBegin() { return __start_fdmtp_xpu_sm; }
size_t SmBytes() {
  return __start_fdmtp_xpu_sm == nullptr
             ? 0
             : static_cast<size_t>(__stop_fdmtp_xpu_sm - __start_fdmtp_xpu_sm);
}

uint64_t Next(uint64_t* s) {  // xorshift64
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

void ReportStats() {
  std::fprintf(stderr,
               "fdmtp xpu-emu: %llu launches, %llu core switches, peak core stack %lld bytes "
               "(limit %lld = local memory %lld + host-frame allowance %lld)\n",
               static_cast<unsigned long long>(g_launches.load()),
               static_cast<unsigned long long>(g_switches.load()),
               static_cast<long long>(g_peak_stack.load()),
               static_cast<long long>(lim::kLocalMemBytes + kHostFrameAllowance),
               static_cast<long long>(lim::kLocalMemBytes),
               static_cast<long long>(kHostFrameAllowance));
}

// Makes the pool hold at least `slots` stacks, every byte of each the pattern.
bool ReservePool(size_t slots, std::string* error) {
  if (slots <= g_pool_slots) return true;
  if (g_pool != nullptr) ::munmap(g_pool, g_pool_slots * kSlotBytes);
  g_pool = nullptr;
  g_pool_slots = 0;
  void* p = ::mmap(nullptr, slots * kSlotBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (p == MAP_FAILED) {
    *error = "cannot map " + std::to_string(slots) + " emulated core stacks";
    return false;
  }
  g_pool = static_cast<char*>(p);
  g_pool_slots = slots;
  for (size_t i = 0; i < slots; ++i) {
    char* slot = g_pool + i * kSlotBytes;
    ::mprotect(slot, kGuardBytes, PROT_NONE);
    std::memset(slot + kGuardBytes, kStackPattern, kCoreStackBytes);
  }
  g_pool_dirty.assign(slots, 0);
  return true;
}

// Bytes of `stack` a core used: from the first non-pattern byte to the top.
size_t StackUsed(const char* stack) {
  size_t i = 0;
  const uint64_t word = 0x0101010101010101ULL * kStackPattern;
  while (i + 8 <= kCoreStackBytes) {
    uint64_t w;
    std::memcpy(&w, stack + i, 8);
    if (w != word) break;
    i += 8;
  }
  while (i < kCoreStackBytes && static_cast<unsigned char>(stack[i]) == kStackPattern) ++i;
  return kCoreStackBytes - i;
}

void SwapSharedMemory(LaunchState& s, int to) {
  if (to == s.sm_owner) return;
  char* base = SmBegin();
  const size_t total = SmBytes();
  std::vector<char>& out = s.cluster[s.sm_owner].sm;
  const std::vector<char>& in = s.cluster[to].sm;
  for (size_t i = 0; i < s.sm_touched.size(); ++i) {
    const size_t off = s.sm_touched[i] * kSmBlock;
    const size_t n = total - off < kSmBlock ? total - off : kSmBlock;
    std::memcpy(out.data() + i * kSmBlock, base + off, n);
    std::memcpy(base + off, in.data() + i * kSmBlock, n);
  }
  s.sm_owner = to;
}

// First access of this launch to shared-memory block `block`: every other cluster's copy
// starts as what the section holds now (shared memory is uninitialised at a launch).
void TouchBlock(LaunchState& s, size_t block) {
  s.sm_touched.push_back(block);
  g_sm_slot[block] = static_cast<uint32_t>(s.sm_touched.size());
  const size_t off = block * kSmBlock;
  const size_t total = SmBytes();
  const size_t n = total - off < kSmBlock ? total - off : kSmBlock;
  for (ClusterState& c : s.cluster) {
    c.sm.resize(s.sm_touched.size() * kSmBlock);
    std::memcpy(c.sm.data() + (s.sm_touched.size() - 1) * kSmBlock, SmBegin() + off, n);
  }
}

void YieldToScheduler() {
  LaunchState& s = *g_launch;
  Core& c = s.core[s.running];
  swapcontext(&c.context, &s.scheduler);
}

LaunchState& Running() {
  if (g_launch == nullptr || g_launch->running < 0) {
    std::fprintf(stderr, "fdmtp xpu-emu: a KP intrinsic was called outside a kernel launch\n");
    std::abort();
  }
  return *g_launch;
}

void OnAccess(const void* addr, size_t bytes, bool is_write) {
  LaunchState* s = g_launch;
  if (s == nullptr || s->running < 0) return;
  Core& c = s->core[s->running];
  const char* p = static_cast<const char*>(addr);
  if (p >= c.stack && p + bytes <= c.stack + kCoreStackBytes) {
    // local memory of the running core
  } else if (p >= SmBegin() && p < SmBegin() + SmBytes()) {
    const size_t first = static_cast<size_t>(p - SmBegin()) / kSmBlock;
    const size_t last = static_cast<size_t>(p + bytes - 1 - SmBegin()) / kSmBlock;
    for (size_t b = first; b <= last && b < g_sm_slot.size(); ++b) {
      if (g_sm_slot[b] == 0) TouchBlock(*s, b);
    }
    if (is_write) c.sm_dirty = true;
  } else if (p >= g_pool && p < g_pool + g_pool_slots * kSlotBytes) {
    const size_t slot = static_cast<size_t>(p - g_pool) / kSlotBytes;
    Fault("core " + std::to_string(c.core) + " of cluster " + std::to_string(c.cluster) +
          (is_write ? " wrote" : " read") + " the local memory of another core (emulated slot " +
          std::to_string(slot) + "): local memory is private to its core");
  }
  if (--s->countdown <= 0) {
    s->countdown = 16 + static_cast<int>(Next(&s->rng) % 113);
    YieldToScheduler();
  }
}

void CoreMain() {
  LaunchState& s = *g_launch;
  (*s.body)();
  Core& c = s.core[s.running];
  c.state = CoreState::kDone;
  ClusterState& cl = s.cluster[c.cluster];
  ++cl.done;
  if (cl.arrived > 0 && s.fault.empty()) {
    s.fault = "cluster " + std::to_string(c.cluster) + ": core " + std::to_string(c.core) +
              " returned while " + std::to_string(cl.arrived) +
              " core(s) wait at sync_cluster() (a deadlock on hardware)";
  }
  // returning resumes uc_link (the scheduler)
}

// The next core to run, or -1 when none is ready.
int PickCore(LaunchState& s) {
  const int n = static_cast<int>(s.core.size());
  if (!s.interleave_clusters) {
    // Without access hooks the section cannot be swapped per cluster: run the clusters one
    // after another, interleaving only the cores of the current one.
    for (;;) {
      const int base = s.sm_owner * s.cores;
      const int start = static_cast<int>(Next(&s.rng) % static_cast<uint64_t>(s.cores));
      for (int k = 0; k < s.cores; ++k) {
        const int i = base + (start + k) % s.cores;
        if (s.core[i].state == CoreState::kReady) return i;
      }
      if (s.cluster[s.sm_owner].done < s.cores || s.sm_owner + 1 >= s.clusters) return -1;
      ++s.sm_owner;
    }
  }
  // Mostly stay in the cluster whose shared memory is loaded (swapping costs), else any.
  if (Next(&s.rng) % 4 != 0) {
    const int base = s.sm_owner * s.cores;
    const int start = static_cast<int>(Next(&s.rng) % static_cast<uint64_t>(s.cores));
    for (int k = 0; k < s.cores; ++k) {
      const int i = base + (start + k) % s.cores;
      if (s.core[i].state == CoreState::kReady) return i;
    }
  }
  const int start = static_cast<int>(Next(&s.rng) % static_cast<uint64_t>(n));
  for (int k = 0; k < n; ++k) {
    const int i = (start + k) % n;
    if (s.core[i].state == CoreState::kReady) return i;
  }
  return -1;
}

}  // namespace

int ClusterId() { return Running().core[g_launch->running].cluster; }
int ClusterNum() { return Running().clusters; }
int CoreId() { return Running().core[g_launch->running].core; }
int CoreNum() { return Running().cores; }

void Mfence() {
  LaunchState& s = Running();
  s.core[s.running].sm_dirty = false;
  Intrinsic();
}

void Intrinsic() {
  Running();
  YieldToScheduler();
}

void SyncCluster() {
  LaunchState& s = Running();
  Core& c = s.core[s.running];
  if (c.sm_dirty) {
    Fault("core " + std::to_string(c.core) + " of cluster " + std::to_string(c.cluster) +
          " wrote shared memory and reached sync_cluster() without mfence()");
  }
  ClusterState& cl = s.cluster[c.cluster];
  if (cl.done > 0) {
    Fault("cluster " + std::to_string(c.cluster) + ": core " + std::to_string(c.core) +
          " waits at sync_cluster() after " + std::to_string(cl.done) +
          " core(s) returned (a deadlock on hardware)");
  }
  if (++cl.arrived == s.cores) {
    cl.arrived = 0;
    for (Core& other : s.core) {
      if (other.cluster == c.cluster && other.state == CoreState::kAtBarrier) {
        other.state = CoreState::kReady;
      }
    }
  } else {
    c.state = CoreState::kAtBarrier;
  }
  YieldToScheduler();
}

bool IsLocal(const volatile void* p, int64_t bytes) {
  if (g_launch == nullptr || g_launch->running < 0) return false;
  const Core& c = g_launch->core[g_launch->running];
  const char* q = const_cast<const char*>(static_cast<const volatile char*>(p));
  return q >= c.stack && bytes >= 0 && q + bytes <= c.stack + kCoreStackBytes;
}

void Fault(const std::string& message) {
  LaunchState& s = Running();
  if (s.fault.empty()) s.fault = message;
  s.core[s.running].state = CoreState::kFaulted;
  YieldToScheduler();  // never resumed
  std::abort();
}

// The context calls live in their own functions, out of Launch's loops: getcontext and
// swapcontext return twice as far as the compiler knows, which would put the loop
// variables at risk (-Wclobbered).
void InitCore(LaunchState& s, size_t i, int cores) {
  Core& c = s.core[i];
  c.cluster = static_cast<int>(i) / cores;
  c.core = static_cast<int>(i) % cores;
  c.stack = g_pool + i * kSlotBytes + kGuardBytes;
  fdmtp::emu::InitCoroutine(&c.context, c.stack, kCoreStackBytes, &s.scheduler, CoreMain);
}

// Runs core `next` until it yields or finishes.
__attribute__((noinline)) void ResumeCore(LaunchState& s, int next) {
  s.running = next;
  swapcontext(&s.scheduler, &s.core[next].context);
  s.running = -1;
}

int Launch(int clusters, int cores, const char* kernel, const std::function<void()>& body,
           std::string* error) {
  const std::string name = std::string("XPU kernel ") + kernel + " (emulated): ";
  if (clusters < 1 || cores < 1 || cores > lim::kMaxCoresPerCluster) {
    *error =
        name + "launch shape <<<" + std::to_string(clusters) + ", " + std::to_string(cores) +
        ">>> is invalid (clusters >= 1, 1 <= cores <= " + std::to_string(lim::kMaxCoresPerCluster) +
        ")";
    return 1;
  }
  static const bool report = [] {
    const char* v = std::getenv("FDMTP_XPU_EMU_STATS");
    if (v != nullptr && v[0] != '\0' && v[0] != '0') std::atexit(ReportStats);
    return true;
  }();
  (void)report;
  std::lock_guard<std::mutex> lock(LaunchMutex());
  const size_t total = static_cast<size_t>(clusters) * static_cast<size_t>(cores);
  if (!ReservePool(total, error)) {
    *error = name + *error;
    return 1;
  }
  LaunchState s;
  s.kernel = kernel;
  s.clusters = clusters;
  s.cores = cores;
  s.body = &body;
  s.interleave_clusters = fdmtp::emu::AccessHooksCompiledIn() && SmBytes() > 0;
  s.cluster.resize(static_cast<size_t>(clusters));
  s.core.resize(total);
  uint64_t seed = 0x9E3779B97F4A7C15ULL ^ (static_cast<uint64_t>(clusters) << 32) ^
                  static_cast<uint64_t>(cores);
  for (const char* k = kernel; *k != '\0'; ++k)
    seed = (seed ^ static_cast<uint8_t>(*k)) * 0x100000001B3ULL;
  s.rng = seed == 0 ? 1 : seed;
  s.countdown = 16;
  if (g_sm_slot.size() != (SmBytes() + kSmBlock - 1) / kSmBlock) {
    g_sm_slot.assign((SmBytes() + kSmBlock - 1) / kSmBlock, 0);
  }
  for (size_t i = 0; i < total; ++i) InitCore(s, i, cores);
  g_launch = &s;
  const fdmtp::emu::AccessHook previous = fdmtp::emu::SetAccessHook(OnAccess);
  uint64_t switches = 0;
  for (;;) {
    if (!s.fault.empty()) break;
    const int next = PickCore(s);
    if (next < 0) break;
    if (s.interleave_clusters) SwapSharedMemory(s, s.core[next].cluster);
    ++switches;
    ResumeCore(s, next);
  }
  fdmtp::emu::SetAccessHook(previous);
  if (s.interleave_clusters) SwapSharedMemory(s, 0);
  g_launch = nullptr;
  for (size_t b : s.sm_touched) g_sm_slot[b] = 0;
  if (s.fault.empty()) {
    int waiting = 0;
    for (const ClusterState& c : s.cluster) waiting += c.arrived;
    if (waiting > 0) {
      s.fault = std::to_string(waiting) +
                " core(s) wait at sync_cluster() forever (a deadlock "
                "on hardware)";
    }
  }
  // Local memory: each core's stack high-water mark (then restore the pattern).
  int64_t peak = 0;
  int peak_core = 0;
  for (size_t i = 0; i < total; ++i) {
    const int64_t used = static_cast<int64_t>(StackUsed(s.core[i].stack));
    if (used > peak) {
      peak = used;
      peak_core = static_cast<int>(i);
    }
    std::memset(s.core[i].stack + kCoreStackBytes - used, kStackPattern, static_cast<size_t>(used));
  }
  ++g_launches;
  g_switches += switches;
  if (peak > g_peak_stack.load()) g_peak_stack = peak;
  if (s.fault.empty() && peak > lim::kLocalMemBytes + kHostFrameAllowance) {
    s.fault = "core " + std::to_string(peak_core % cores) + " of cluster " +
              std::to_string(peak_core / cores) + " used " + std::to_string(peak) +
              " bytes of stack, more than local memory (" + std::to_string(lim::kLocalMemBytes) +
              " bytes, xpu_limits.h) plus the emulator's host-frame allowance (" +
              std::to_string(kHostFrameAllowance) + ")";
  }
  if (!s.fault.empty()) {
    *error = name + s.fault;
    return 1;
  }
  return 0;
}

}  // namespace fdmtp_kpemu
