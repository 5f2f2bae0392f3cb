// Memory-access hooks of the accelerator emulators (the CUDA emulator in gpu/emu/ and the
// KP emulator in xpu/emu/).
//
// The emulated kernel units are compiled with GCC's ThreadSanitizer instrumentation
// (-fsanitize=thread, without function entry/exit events) but linked without its runtime:
// every load and store that may touch memory shared between threads (globals and statics,
// such as emulated shared memory, and everything reached through a pointer; not the
// function's own non-escaping locals) calls __tsan_{read,write}<N>(addr).
// access_hooks.cc defines those callbacks; each forwards the access to the hook of the
// emulated launch running on this thread, or returns at once when none is (the callbacks
// must stay cheap and harmless anywhere). AddressSanitizer's instrumentation would not do:
// it skips accesses to globals at constant offsets, i.e. scalar shared variables.
//
// Builds that compile everything with -fsanitize=address (scripts/asan_check.sh) leave the
// kernel instrumentation out (-fsanitize=thread cannot be combined with it); there
// AddressSanitizer itself checks the kernels' accesses and the hooks are never called.
#pragma once

#include <cstddef>

namespace fdmtp {
namespace emu {

// Called for every instrumented access of `bytes` bytes at `addr` while installed.
using AccessHook = void (*)(const void* addr, size_t bytes, bool is_write);

// Installs `hook` for this thread (nullptr: none) and returns the previous one.
AccessHook SetAccessHook(AccessHook hook);

// True when this build compiled the emulated kernels with the access instrumentation.
bool AccessHooksCompiledIn();

}  // namespace emu
}  // namespace fdmtp
