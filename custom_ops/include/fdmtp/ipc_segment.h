// Tensors shared across processes by name (set_data_ipc / share_external_data /
// unset_data_ipc): the named-segment layout and the mapping object that keeps shared
// memory alive. Framework-free, host-only.
//
// A segment is a POSIX shared-memory object (shm_open(name), i.e. /dev/shm/<name>). Its
// first 72 bytes are upstream FastDeploy's `shmStruct {size_t nprocesses;
// cudaIpcMemHandle_t memHandle;}`, so an upstream attacher can read a CUDA segment we
// wrote; our descriptor follows it:
//
//   kind kHostData   the tensor's bytes live in the segment at `data_offset` (4096);
//   kind kCudaHandle the segment holds the cudaIpcMemHandle_t of the allocation that
//                    contains the tensor, and the tensor's byte offset inside it.
//   kind kXpuHandle  the segment holds the XPUIpcMemHandle of the tensor's device memory
//                    (where upstream keeps the CUDA handle) and, as upstream's XPU
//                    shmStruct does, the creator's raw device pointer `data_ptr_addr`
//                    (share_external_data with use_ipc=False reuses it in the creator's
//                    process). Upstream's XPU struct has it right after the handle, at byte
//                    72, where our `magic` is; ours is at the end of the descriptor.
//
// `magic` is stored last (release order) once the segment is complete, so an attacher
// never maps a half-written segment.
//
// Trust: a creator makes its segment with mode 0600, exclusively (a stale segment of the
// same name and owner is unlinked first; another user's is refused). An attacher maps only
// a regular file owned by its own effective uid with no group/other permission bits, and
// checks every descriptor field before using it: version, kind, dtype, device id and
// creator pid in range; data_offset + data_bytes without wrap-around; for host data an
// offset that is page aligned past the header and a range inside the segment; for XPU
// handles offset 0. See docs/architecture.md "Processes and shared memory".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fdmtp/tensor_ref.h"

namespace fdmtp {
namespace ipc {

constexpr uint64_t kMagic = 0x4350494d54504446ULL;  // "FDPTMIPC" little-endian
constexpr uint32_t kVersion = 1;
constexpr uint32_t kHostData = 1;
constexpr uint32_t kCudaHandle = 2;
constexpr uint32_t kXpuHandle = 3;
constexpr size_t kCudaHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
constexpr size_t kUpstreamBytes = 8 + kCudaHandleBytes;
constexpr uint64_t kHostDataOffset = 4096;  // page aligned data for host segments
constexpr int32_t kMaxDeviceId = 1024;      // device ids an attacher accepts: 0..1023

struct SegmentHeader {
  uint64_t nprocesses;                    // upstream field, always 0
  uint8_t cuda_handle[kCudaHandleBytes];  // upstream field (the XPU handle in XPU segments)
  // ---- ours: upstream readers stop above ----
  uint64_t magic;
  uint32_t version;
  uint32_t kind;         // kHostData, kCudaHandle or kXpuHandle
  int32_t dtype;         // fdmtp::DType
  int32_t device_id;     // CUDA / XPU device of the exporter
  uint64_t data_bytes;   // bytes of the shared tensor
  uint64_t data_offset;  // kHostData: offset in the segment; kCudaHandle: in the allocation
  int64_t creator_pid;
  uint64_t data_ptr_addr;  // kXpuHandle: the creator's device pointer (upstream's XPU field)
};
static_assert(offsetof(SegmentHeader, magic) == kUpstreamBytes,
              "the upstream-compatible prefix must stay 72 bytes");
static_assert(sizeof(SegmentHeader) == 128, "the descriptor layout is fixed");

// Memory shared with another process: a host mapping of a segment (unmapped when the
// last owner lets go) or an opened CUDA / XPU IPC handle (closed likewise), or (XPU,
// use_ipc=False) a view of the creator's own device memory that owns nothing. Bindings hand a
// shared_ptr of it to every tensor that views the memory, so nothing reads it after it
// was released.
class SharedBuffer {
 public:
  virtual ~SharedBuffer() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  int device_id() const { return device_id_; }

 protected:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCPU;
  int device_id_ = 0;
};

// The segment names accepted by the ops: 1..255 bytes, no '/' and no NUL (passed to
// shm_open as is; glibc adds the leading slash). Throws via `check`.
void CheckName(const ArgChecker& check, const std::string& name);

}  // namespace ipc
}  // namespace fdmtp
