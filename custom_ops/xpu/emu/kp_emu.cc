// The cooperative scheduler behind kp_emu.h (see there for the model and its limits).
#include "kp_emu.h"

#include <ucontext.h>

#include <memory>
#include <mutex>
#include <vector>

namespace fdmtp {
namespace xpu_emu {
namespace {

// Stack of one emulated core: its local arrays plus the frames of the shared per-item
// logic it calls.
constexpr size_t kCoreStackBytes = 256 * 1024;

enum class CoreState { kReady, kAtBarrier, kDone };

struct KernelFault {
  std::string message;
};

struct Core {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  CoreState state = CoreState::kReady;
};

struct LaunchState {
  int clusters = 0;
  int cores = 0;
  int cluster = 0;
  int core = -1;  // the running core, -1 in the scheduler
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  std::vector<Core> core_state;
  std::string fault;
};

LaunchState* g_launch = nullptr;  // guarded by LaunchMutex()

std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}

LaunchState& Running() {
  if (g_launch == nullptr || g_launch->core < 0) {
    throw KernelFault{"a KP intrinsic was called outside a kernel launch"};
  }
  return *g_launch;
}

void CoreMain() {
  LaunchState& s = *g_launch;
  try {
    (*s.body)();
  } catch (const KernelFault& f) {
    if (s.fault.empty()) s.fault = f.message;
  }
  s.core_state[s.core].state = CoreState::kDone;
  // returning resumes uc_link (the scheduler)
}

}  // namespace

int ClusterId() { return Running().cluster; }
int ClusterNum() { return Running().clusters; }
int CoreId() { return Running().core; }
int CoreNum() { return Running().cores; }

void SyncCluster() {
  LaunchState& s = Running();
  Core& c = s.core_state[s.core];
  c.state = CoreState::kAtBarrier;
  swapcontext(&c.context, &s.scheduler);
}

bool IsLocal(const void* p, int64_t bytes) {
  if (g_launch == nullptr || g_launch->core < 0) return false;
  const Core& c = g_launch->core_state[g_launch->core];
  const char* lo = c.stack.get();
  const char* q = static_cast<const char*>(p);
  return q >= lo && q + bytes <= lo + kCoreStackBytes;
}

void Fault(const std::string& message) { throw KernelFault{message}; }

int Launch(int clusters, int cores, const char* kernel, const std::function<void()>& body,
           std::string* error) {
  const std::string name = std::string("XPU kernel ") + kernel + " (emulated): ";
  if (clusters < 1 || cores < 1 || cores > xpu::kMaxCoresPerCluster) {
    *error =
        name + "launch shape <<<" + std::to_string(clusters) + ", " + std::to_string(cores) +
        ">>> is invalid (clusters >= 1, 1 <= cores <= " + std::to_string(xpu::kMaxCoresPerCluster) +
        ")";
    return 1;
  }
  std::lock_guard<std::mutex> lock(LaunchMutex());
  LaunchState s;
  s.clusters = clusters;
  s.cores = cores;
  s.body = &body;
  s.core_state.resize(static_cast<size_t>(cores));
  for (Core& c : s.core_state) c.stack.reset(new char[kCoreStackBytes]);
  g_launch = &s;
  for (s.cluster = 0; s.cluster < clusters && s.fault.empty(); ++s.cluster) {
    for (Core& c : s.core_state) {
      c.state = CoreState::kReady;
      getcontext(&c.context);
      c.context.uc_stack.ss_sp = c.stack.get();
      c.context.uc_stack.ss_size = kCoreStackBytes;
      c.context.uc_link = &s.scheduler;
      makecontext(&c.context, CoreMain, 0);
    }
    for (;;) {
      // One phase: every ready core runs until its next sync_cluster() or its end.
      for (int i = cores - 1; i >= 0 && s.fault.empty(); --i) {
        if (s.core_state[i].state != CoreState::kReady) continue;
        s.core = i;
        swapcontext(&s.scheduler, &s.core_state[i].context);
        s.core = -1;
      }
      if (!s.fault.empty()) break;
      int waiting = 0;
      int done = 0;
      for (const Core& c : s.core_state) {
        waiting += c.state == CoreState::kAtBarrier ? 1 : 0;
        done += c.state == CoreState::kDone ? 1 : 0;
      }
      if (done == cores) break;
      if (done > 0) {
        s.fault = "cluster " + std::to_string(s.cluster) + ": " + std::to_string(done) +
                  " core(s) returned while " + std::to_string(waiting) +
                  " wait at sync_cluster() (a deadlock on hardware)";
        break;
      }
      for (Core& c : s.core_state) c.state = CoreState::kReady;
    }
  }
  g_launch = nullptr;
  if (!s.fault.empty()) {
    *error = name + s.fault;
    return 1;
  }
  return 0;
}

}  // namespace xpu_emu
}  // namespace fdmtp
