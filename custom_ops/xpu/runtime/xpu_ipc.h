// XPU runtime calls of set_data_ipc / share_external_data (entry/ipc_entries.cc): export, open and
// close IPC handles of XPU device memory, the counterpart of gpu/cuda_ipc.cu. With the Kunlun SDK
// (FDMTP_WITH_XPU) these call XRE's xpu_ipc_get_memhandle / xpu_ipc_open_memhandle /
// xpu_ipc_close_memhandle; in the default build they call the emulated XRE of
// emu/xre_emu.h, whose device memory is host memory that other processes can open.
// Host-side calls only; nothing is launched. Each returns kSuccess, else an error status
// with LastError() naming the failed call and why.
#pragma once

#include <cstddef>
#include <cstdint>

#include "xpu/plugin.h"

namespace fdmtp {
namespace xpu {

// sizeof(XPUIpcMemHandle): stored where upstream's shmStruct keeps its handle (bytes 8..71
// of the segment). 64 is an assumption for the real XRE, checked by a static_assert when
// the SDK's header is compiled.
constexpr size_t kIpcHandleBytes = 64;

// Writes the IPC handle of the device memory at `ptr` into `handle` (kIpcHandleBytes).
int IpcGetMemHandle(const void* ptr, void* handle);
// Opens `handle` on `device`; *ptr is this process's pointer to the exported memory.
int IpcOpenMemHandle(const void* handle, int device, void** ptr);
// Closes a pointer returned by IpcOpenMemHandle.
int IpcCloseMemHandle(void* ptr);
// False when [ptr, ptr + bytes) is known not to be live device memory of this process (the
// emulator tracks its allocations; on a device this cannot be asked and is always true).
bool MaybeLiveDeviceMemory(const void* ptr, uint64_t bytes);
// Device memory for exported tensors (the framework-free module's xpu_emu_empty).
int Malloc(uint64_t bytes, void** ptr);
int Free(void* ptr);

}  // namespace xpu
}  // namespace fdmtp
