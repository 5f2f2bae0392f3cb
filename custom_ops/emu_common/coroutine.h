// The coroutines both emulators run their threads / cores as (ucontext): one call to set
// one up on its own stack, returning to `link` when its function returns.
#pragma once

#include <ucontext.h>

#include <cstddef>

namespace fdmtp {
namespace emu {

// Prepares `context` to run `fn` on [stack, stack + bytes), then resume `link`. Not inline:
// getcontext returns twice as far as the compiler knows, so it stays out of the callers'
// loops (-Wclobbered).
__attribute__((noinline)) inline void InitCoroutine(ucontext_t* context, char* stack, size_t bytes,
                                                    ucontext_t* link, void (*fn)()) {
  getcontext(context);
  context->uc_stack.ss_sp = stack;
  context->uc_stack.ss_size = bytes;
  context->uc_link = link;
  makecontext(context, fn, 0);
}

}  // namespace emu
}  // namespace fdmtp
