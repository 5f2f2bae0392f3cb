// NOT the Kunlun SDK's header: the XRE declarations that custom_ops/xpu/runtime/ipc.cpp
// assumes (names, argument order, status convention, the 64-byte handle), written from
// FastDeploy's XPU set_data_ipc / share_external_data. tests/ops/test_ipc_xpu.py compiles
// the FDMTP_WITH_XPU branch of the IPC path against it so that branch cannot rot unseen;
// where the real header differs, the real build will say so (docs/architecture.md).
#pragma once

#include <cstdint>

#define XPURT_VERSION_MAJOR 5

typedef struct {
  char reserved[64];
} XPUIpcMemHandle;

enum { XPU_SUCCESS = 0 };
enum XPUMemoryKind { XPU_MEM_MAIN = 0 };

int xpu_malloc(void** devptr, uint64_t size, XPUMemoryKind kind = XPU_MEM_MAIN);
int xpu_free(void* devptr);
int xpu_current_device(int* device);
int xpu_set_device(int device);
int xpu_ipc_get_memhandle(XPUIpcMemHandle* handle, void* devptr);
int xpu_ipc_open_memhandle(void** devptr, XPUIpcMemHandle handle, int flags);
int xpu_ipc_close_memhandle(void* devptr);
const char* xpu_strerror(int status);
