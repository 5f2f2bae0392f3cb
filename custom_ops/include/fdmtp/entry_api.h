// The hand-written part of the framework-free entry API (the generated fdmtp/ops.h adds one
// entry per declared op): build info, the scratch allocator the bindings provide, and the
// entries of the cross-process tensor ops, which manage storage and are not generated.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "fdmtp/ipc_segment.h"
#include "fdmtp/tensor_ref.h"

namespace fdmtp {

// Where the build put each backend; reported by fastdeploy_mtp.ops.backends().
bool BuiltWithCuda();
bool BuiltWithXpu();

// Device scratch for the ops that need some (the n-gram ops), provided by the binding from
// its framework's stream-ordered allocator. Allocate is called after every check passed,
// only for device tensors; the memory must stay usable by the work queued on the op's
// stream after the allocator is destroyed (stream-ordered release).
class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
};

// Cross-process tensors by name (fdmtp/ipc_segment.h; entry/ipc_entries.cc). Host tensors:
// SetDataIpc creates segment `shm_name` (replacing a stale one), copies the tensor's bytes
// into it and returns the mapping; the binding must make the tensor's storage that mapping.
// CUDA / XPU tensors (XPU: also host tensors inside the emulator's xpu_emulation): exports
// the memory's IPC handle into the segment and returns nullptr.
std::shared_ptr<ipc::SharedBuffer> SetDataIpc(const TensorRef& tmp_input,
                                              const std::string& shm_name);
// Attaches segment `shm_name` as a tensor of `input`'s dtype and device and `shape`;
// checks the name, the dtype, the device kind and that the shape fits. The returned
// buffer (mapped host memory or an opened CUDA / XPU handle) is released with its last
// owner. use_ipc (upstream's XPU attr): false reuses an XPU segment's stored device
// pointer instead of opening its handle; only in the creator's process (checked).
std::shared_ptr<ipc::SharedBuffer> ShareExternalData(const TensorRef& input,
                                                     const std::string& shm_name,
                                                     const std::vector<int64_t>& shape,
                                                     bool use_ipc = true);
// Checks the name and, with unlink_shm, unlinks the segment (a missing one is fine).
// close_ipc is carried out by the binding, which owns the tensor's storage.
void UnsetDataIpc(const TensorRef& tmp_input, const std::string& shm_name, bool unlink_shm);

}  // namespace fdmtp
