// The instrumentation callbacks behind access_hooks.h.
#include "access_hooks.h"

#include <cstdint>

namespace fdmtp {
namespace emu {
namespace {

thread_local AccessHook t_hook = nullptr;

inline void Forward(uintptr_t addr, size_t bytes, bool is_write) {
  const AccessHook hook = t_hook;
  if (hook != nullptr) hook(reinterpret_cast<const void*>(addr), bytes, is_write);
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
// The callbacks GCC emits under -fsanitize=kernel-address with call-threshold 0.
#define FDMTP_EMU_SIZED_HOOKS(n)                             \
  extern "C" void __asan_load##n##_noabort(uintptr_t addr) { \
    fdmtp::emu::Forward(addr, n, false);                     \
  }                                                          \
  extern "C" void __asan_store##n##_noabort(uintptr_t addr) { fdmtp::emu::Forward(addr, n, true); }
FDMTP_EMU_SIZED_HOOKS(1)
FDMTP_EMU_SIZED_HOOKS(2)
FDMTP_EMU_SIZED_HOOKS(4)
FDMTP_EMU_SIZED_HOOKS(8)
FDMTP_EMU_SIZED_HOOKS(16)
#undef FDMTP_EMU_SIZED_HOOKS
extern "C" void __asan_loadN_noabort(uintptr_t addr, size_t bytes) {
  fdmtp::emu::Forward(addr, bytes, false);
}
extern "C" void __asan_storeN_noabort(uintptr_t addr, size_t bytes) {
  fdmtp::emu::Forward(addr, bytes, true);
}
// Emitted before calls that do not return (throw); nothing to unpoison without redzones.
extern "C" void __asan_handle_no_return() {}
#endif
