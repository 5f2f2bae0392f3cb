// Memory-access hooks of the accelerator emulators (the CUDA emulator in gpu/emu/ and the
// KP emulator in xpu/emu/).
//
// The emulated kernel units are compiled with GCC's outline KASAN instrumentation
// (-fsanitize=kernel-address --param asan-instrumentation-with-call-threshold=0, no stack
// or global redzones): every load and store in them calls __asan_{load,store}<N>_noabort
// with its address. access_hooks.cc defines those callbacks; each forwards the access to
// the hook of the emulated launch running on this thread, or returns at once when none is
// (the instrumented code is only ever reached from an emulated launch, but the callbacks
// must stay cheap and harmless anywhere).
//
// Builds that compile everything with -fsanitize=address (scripts/asan_check.sh) leave the
// kernel instrumentation out (the two sanitizers cannot be combined); there AddressSanitizer
// itself checks the kernels' accesses and the hooks are never called.
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
