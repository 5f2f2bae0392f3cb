// The XPU IPC runtime calls (see xpu_ipc.h): XRE with the Kunlun SDK, the emulated XRE otherwise.
#include "xpu/runtime/xpu_ipc.h"

#include <cstring>
#include <string>

#if defined(FDMTP_XPU_EMULATOR)
#include "xpu/emu/xre_emu.h"
#else
#include "xpu/runtime.h"  // XRE
#endif

namespace fdmtp {
namespace xpu {
namespace detail {
void SetLastError(const std::string& message);  // wrapper/context.cpp
}  // namespace detail

namespace {

#if defined(FDMTP_XPU_EMULATOR)
using namespace ::fdmtp::xpu_emu;  // the emulated xpu_* calls, same names as XRE's
constexpr bool kXreHasIpc = true;
const char* kRuntimeName = "emulated XRE";
std::string XreMessage(int) { return LastXreError(); }
#else
// XRE 5 (XPU3 / P800) has the IPC calls; FastDeploy refuses them on XRE 4 (Kunlun2) too.
constexpr bool kXreHasIpc = XPURT_VERSION_MAJOR >= 5;
const char* kRuntimeName = "XRE";
std::string XreMessage(int status) { return xpu_strerror(status); }  // assumed XRE API
#endif
static_assert(sizeof(XPUIpcMemHandle) == kIpcHandleBytes,
              "the segment keeps 64 handle bytes where upstream's shmStruct has them");

// FastDeploy opens handles with flag 0x01 (lazy peer access), as CUDA's
// cudaIpcMemLazyEnablePeerAccess.
constexpr int kOpenFlags = 0x01;

int Failed(const char* call, int status) {
  detail::SetLastError(std::string(call) + " failed (" + kRuntimeName + " status " +
                       std::to_string(status) + "): " + XreMessage(status));
  return kLaunchFailed;
}

int NoIpc(const char* call) {
  detail::SetLastError(std::string(call) +
                       ": this XRE has no IPC calls (XPURT_VERSION_MAJOR < 5, Kunlun2)");
  return kUnimplemented;
}

}  // namespace

int IpcGetMemHandle(const void* ptr, void* handle) {
  if (!kXreHasIpc) return NoIpc("xpu_ipc_get_memhandle");
  XPUIpcMemHandle h;
  const int status = xpu_ipc_get_memhandle(&h, const_cast<void*>(ptr));
  if (status != XPU_SUCCESS) return Failed("xpu_ipc_get_memhandle", status);
  std::memcpy(handle, &h, sizeof(h));
  return kSuccess;
}

int IpcOpenMemHandle(const void* handle, int device, void** ptr) {
  *ptr = nullptr;
  if (!kXreHasIpc) return NoIpc("xpu_ipc_open_memhandle");
  int previous = 0;
  int status = xpu_current_device(&previous);
  if (status != XPU_SUCCESS) return Failed("xpu_current_device", status);
  status = xpu_set_device(device);
  if (status != XPU_SUCCESS) return Failed("xpu_set_device", status);
  XPUIpcMemHandle h;
  std::memcpy(&h, handle, sizeof(h));
  const int opened = xpu_ipc_open_memhandle(ptr, h, kOpenFlags);
  const int failed = opened != XPU_SUCCESS ? Failed("xpu_ipc_open_memhandle", opened) : kSuccess;
  status = xpu_set_device(previous);
  if (failed != kSuccess) return failed;
  if (status != XPU_SUCCESS) {
    IpcCloseMemHandle(*ptr);
    *ptr = nullptr;
    return Failed("xpu_set_device", status);
  }
  return kSuccess;
}

int IpcCloseMemHandle(void* ptr) {
  if (!kXreHasIpc) return NoIpc("xpu_ipc_close_memhandle");
  const int status = xpu_ipc_close_memhandle(ptr);
  return status == XPU_SUCCESS ? kSuccess : Failed("xpu_ipc_close_memhandle", status);
}

bool MaybeLiveDeviceMemory(const void* ptr, uint64_t bytes) {
#if defined(FDMTP_XPU_EMULATOR)
  return IsLiveAllocation(ptr, bytes);
#else
  (void)ptr;
  (void)bytes;
  return true;
#endif
}

int Malloc(uint64_t bytes, void** ptr) {
  const int status = xpu_malloc(ptr, bytes);
  return status == XPU_SUCCESS ? kSuccess : Failed("xpu_malloc", status);
}

int Free(void* ptr) {
  const int status = xpu_free(ptr);
  return status == XPU_SUCCESS ? kSuccess : Failed("xpu_free", status);
}

}  // namespace xpu
}  // namespace fdmtp
