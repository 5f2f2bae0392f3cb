// Plugin state: the last error message and the emulation scope (see plugin.h).
#include "wrapper.h"

namespace fdmtp {
namespace xpu {
namespace {

thread_local std::string t_last_error;
thread_local const Context* t_emulation = nullptr;

}  // namespace

const std::string& LastError() { return t_last_error; }

EmulationScope::EmulationScope(int clusters, int cores) : previous_(t_emulation) {
  context_.dev = DevType::kXpu3;
  context_.clusters = clusters;
  context_.cores = cores;
  t_emulation = &context_;
}

EmulationScope::~EmulationScope() { t_emulation = previous_; }

const Context* ActiveEmulation() { return t_emulation; }

namespace detail {

void SetLastError(const std::string& message) { t_last_error = message; }

int InvalidArgument(const char* op, const std::string& message) {
  SetLastError(std::string(op) + ": " + message);
  return kInvalidArgument;
}

int LaunchFailed(const char* op, const std::string& message) {
  SetLastError(std::string(op) + ": " + message);
  return kLaunchFailed;
}

}  // namespace detail
}  // namespace xpu
}  // namespace fdmtp
