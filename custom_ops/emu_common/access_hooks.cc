// The instrumentation callbacks behind access_hooks.h.
#include "access_hooks.h"

#include <cstdint>

namespace fdmtp {
namespace emu {
namespace {

thread_local AccessHook t_hook = nullptr;

inline void Forward(const void* addr, size_t bytes, bool is_write) {
  const AccessHook hook = t_hook;
  if (hook != nullptr) hook(addr, bytes, is_write);
}

}  // namespace

AccessHook SetAccessHook(AccessHook hook) {
  const AccessHook previous = t_hook;
  t_hook = hook;
  return previous;
}

bool AccessHooksCompiledIn() {
#if defined(FDMTP_EMU_ACCESS_HOOKS)
  return true;
#else
  return false;
#endif
}

}  // namespace emu
}  // namespace fdmtp

#if defined(FDMTP_EMU_ACCESS_HOOKS)
// The callbacks GCC emits under -fsanitize=thread (no ThreadSanitizer runtime is linked:
// these definitions are the whole "runtime").
#define FDMTP_EMU_SIZED_HOOKS(n)                                                                \
  extern "C" void __tsan_read##n(void* addr) { fdmtp::emu::Forward(addr, n, false); }           \
  extern "C" void __tsan_write##n(void* addr) { fdmtp::emu::Forward(addr, n, true); }           \
  extern "C" void __tsan_unaligned_read##n(void* addr) { fdmtp::emu::Forward(addr, n, false); } \
  extern "C" void __tsan_unaligned_write##n(void* addr) { fdmtp::emu::Forward(addr, n, true); }
FDMTP_EMU_SIZED_HOOKS(1)
FDMTP_EMU_SIZED_HOOKS(2)
FDMTP_EMU_SIZED_HOOKS(4)
FDMTP_EMU_SIZED_HOOKS(8)
FDMTP_EMU_SIZED_HOOKS(16)
#undef FDMTP_EMU_SIZED_HOOKS
extern "C" void __tsan_read_range(void* addr, size_t bytes) {
  fdmtp::emu::Forward(addr, bytes, false);
}
extern "C" void __tsan_write_range(void* addr, size_t bytes) {
  fdmtp::emu::Forward(addr, bytes, true);
}
// Called by the instrumented units' constructors; nothing to set up.
extern "C" void __tsan_init() {}
#endif
