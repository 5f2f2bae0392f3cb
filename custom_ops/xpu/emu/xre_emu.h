// An emulator of the part of Kunlun's XRE runtime (libxpurt, header xpu/runtime.h) that the
// XPU IPC path uses: device allocations and their IPC handles. "Device memory" is host
// memory in a named POSIX shared-memory region per allocation, so a handle exported by one
// process can be opened by another, as on a Kunlun device:
//
//   xpu_malloc       creates /dev/shm/fdmtpxe.<pid>.<n> (the allocation) and maps it;
//   xpu_free         unmaps and unlinks it (processes that opened it keep their mapping);
//   xpu_ipc_get_memhandle   writes the region's name, size and the pointer's offset in it;
//   xpu_ipc_open_memhandle  maps the region and returns the pointer the exporter passed;
//   xpu_ipc_close_memhandle unmaps it.
//
// The functions carry XRE's names and argument order (as far as they are known, see
// docs/architecture.md "XPU backend") but live in namespace fdmtp::xpu_emu, so a process that
// also loads the real libxpurt has no clash. Like CUDA IPC (and as assumed for XRE), a handle
// cannot be opened in the process that exported it: upstream's `use_ipc=False` path exists
// for that case. Every function returns XPU_SUCCESS (0) or an error code; LastXreError()
// then holds a message saying why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fdmtp {
namespace xpu_emu {

// XRE's XPUIpcMemHandle: an opaque 64-byte record (assumed size, see xpu/runtime/xpu_ipc.h).
struct XPUIpcMemHandle {
  char reserved[64];
};

enum XreStatus : int {
  XPU_SUCCESS = 0,
  XPUERR_INVALID_VALUE = 1,   // a bad pointer or handle
  XPUERR_NOMEM = 2,           // the region could not be created or mapped
  XPUERR_INVALID_HANDLE = 3,  // the handle's allocation is gone, or it is this process's own
};

int xpu_malloc(void** ptr, uint64_t size);
int xpu_free(void* ptr);
int xpu_current_device(int* device);
int xpu_set_device(int device);
int xpu_ipc_get_memhandle(XPUIpcMemHandle* handle, void* ptr);
int xpu_ipc_open_memhandle(void** ptr, XPUIpcMemHandle handle, int flags);
int xpu_ipc_close_memhandle(void* ptr);

// Why the last call on this thread failed.
const std::string& LastXreError();
// True when [ptr, ptr + bytes) lies inside a live xpu_malloc allocation of this process.
bool IsLiveAllocation(const void* ptr, uint64_t bytes);

}  // namespace xpu_emu
}  // namespace fdmtp
