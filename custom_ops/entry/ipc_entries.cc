// set_data_ipc / share_external_data / unset_data_ipc: POSIX shared-memory segments
// (shm_open + mmap) and, for CUDA and XPU tensors, the IPC handles stored in them. See
// fdmtp/ipc_segment.h for the segment layout. XPU memory is a Kunlun device's (FDMTP_WITH_XPU) or,
// in the default build, the emulated XRE's (host tensors while xpu_emulation is active on
// this thread, see xpu/emu/xre_emu.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch.h"
#include "fdmtp/ops.h"
#include "xpu/runtime/xpu_ipc.h"

namespace fdmtp {
namespace ipc {
namespace {

size_t ElementBytes(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUInt8: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    default: return 0;  // not shareable
  }
}

std::string Quoted(const std::string& name) { return "`" + name + "`"; }

std::string Errno(int err) { return std::strerror(err); }

std::string Octal(unsigned mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "0%03o", mode & 0777u);
  return text;
}

// The byte size of a tensor of `dtype` and `shape`, refusing negative dimensions and sizes
// whose element count exceeds kMaxElements (so the product cannot wrap). `text` receives
// the shape as "[a, b]".
size_t ShapeBytes(const ArgChecker& check, DType dtype, const std::vector<int64_t>& shape,
                  std::string* text) {
  *text = "[";
  for (size_t i = 0; i < shape.size(); ++i) *text += (i ? ", " : "") + std::to_string(shape[i]);
  *text += "]";
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) check.Fail("`shape` " + *text + " has a negative dimension " + std::to_string(d));
  }
  for (int64_t d : shape) {
    if (d != 0 && n > kMaxElements / d) {
      check.Fail("`shape` " + *text + " has more than 2^56 elements; its byte size overflows");
    }
    n *= d;
  }
  return static_cast<size_t>(n) * ElementBytes(dtype);  // <= 2^58: no wrap
}

// Where a tensor's memory is, for sharing.
enum class Where { kHost, kCuda, kXpu };

Where Locate(const TensorRef& t) {
  if (t.device == Device::kCUDA) return Where::kCuda;
  if (t.device == Device::kXPU) return Where::kXpu;
#if defined(FDMTP_XPU_EMULATOR)
  if (t.device == Device::kCPU && xpu::ActiveEmulation() != nullptr) return Where::kXpu;
#endif
  return Where::kHost;
}

uint32_t KindOf(Where where) {
  return where == Where::kHost ? kHostData : where == Where::kCuda ? kCudaHandle : kXpuHandle;
}

// What a segment of `kind` holds, and where a placeholder must be to attach it.
const char* Holds(uint32_t kind) {
  return kind == kHostData     ? "host memory"
         : kind == kCudaHandle ? "a CUDA IPC handle"
                               : "an XPU IPC handle";
}
const char* AttachOn(uint32_t kind) {
#if defined(FDMTP_XPU_EMULATOR)
  if (kind == kHostData) return "the CPU (outside xpu_emulation)";
  if (kind == kXpuHandle) return "the XPU device (emulator: a host array inside xpu_emulation)";
#endif
  return kind == kHostData ? "the CPU" : kind == kCudaHandle ? "the CUDA device" : "the XPU device";
}
std::string Placement(const TensorRef& t) {
  if (t.device == Device::kCPU && Locate(t) == Where::kXpu)
    return "emulated XPU memory (inside xpu_emulation)";
  return std::string("on ") + DeviceName(t.device);
}

// The shareable dtypes are upstream's: bfloat16, float16, float32, int8, uint8.
void CheckShareableDtype(const ArgChecker& check, const TensorRef& t) {
  if (ElementBytes(t.dtype) == 0) {
    check.Fail(std::string("`") + t.name + "` has dtype " + DTypeName(t.dtype) +
               "; only float32, float16, bfloat16, int8 and uint8 tensors can be shared");
  }
}

void CheckDevice(const ArgChecker& check, const TensorRef& t) {
  if (t.device == Device::kCPU) return;
  if (t.device == Device::kCUDA) {
#if !defined(FDMTP_WITH_CUDA)
    check.Fail(std::string("`") + t.name +
               "` is a CUDA tensor but this build of fastdeploy_mtp has no CUDA support");
#endif
    return;
  }
  if (t.device == Device::kXPU) {
#if !defined(FDMTP_WITH_XPU)
    check.Fail(std::string("`") + t.name +
               "` is an XPU tensor but this build of fastdeploy_mtp has no XPU support "
               "(FDMTP_WITH_XPU is OFF; the emulator shares host arrays inside xpu_emulation)");
#endif
    return;
  }
  check.Fail(std::string("`") + t.name + "` is on " + DeviceName(t.device) +
             "; only CPU, CUDA and XPU tensors can be shared");
}

void CheckCuda(const ArgChecker& check, int status, const char* what) {
#if defined(FDMTP_WITH_CUDA)
  if (status != 0) {
    check.Fail(std::string(what) + " failed: " + cuda::ErrorName(status) + ": " +
               cuda::ErrorString(status));
  }
#else
  (void)status;
  check.Fail(std::string(what) + ": this build of fastdeploy_mtp has no CUDA support");
#endif
}

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A whole-segment mapping, unmapped with its last owner.
class HostMapping : public SharedBuffer {
 public:
  HostMapping(void* base, size_t mapped, uint64_t offset, size_t bytes)
      : base_(base), mapped_(mapped) {
    data_ = static_cast<char*>(base) + offset;
    bytes_ = bytes;
  }
  ~HostMapping() override {
    if (base_ != nullptr) ::munmap(base_, mapped_);
  }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  // Hands the mapping over to another HostMapping (this one no longer unmaps it).
  void Release() { base_ = nullptr; }

 private:
  void* base_;
  size_t mapped_;
};

#if defined(FDMTP_WITH_CUDA)
// An opened CUDA IPC handle, closed with its last owner.
class CudaMapping : public SharedBuffer {
 public:
  CudaMapping(void* base, uint64_t offset, size_t bytes, int device) : base_(base) {
    data_ = static_cast<char*>(base) + offset;
    bytes_ = bytes;
    device_ = Device::kCUDA;
    device_id_ = device;
  }
  ~CudaMapping() override { cuda::IpcCloseMemHandle(base_); }

 private:
  void* base_;
};
#endif

// XPU memory of another process (an opened IPC handle, closed with its last owner), or,
// with use_ipc=False, the creator's own device memory (owned by the creator's tensor).
class XpuMapping : public SharedBuffer {
 public:
  XpuMapping(void* ptr, uint64_t offset, size_t bytes, int device, bool opened)
      : opened_(opened ? ptr : nullptr) {
    data_ = static_cast<char*>(ptr) + offset;
    bytes_ = bytes;
    device_ = Device::kXPU;
    device_id_ = device;
  }
  ~XpuMapping() override {
    if (opened_ != nullptr) xpu::IpcCloseMemHandle(opened_);
  }

 private:
  void* opened_;
};

// The segment behind `fd` may be trusted: a regular shared-memory file owned by this
// process's effective uid with no group or other permission bits (set_data_ipc creates
// segments with mode 0600). Anything else may have been planted, or be readable and
// writable, by another local user; it is refused. `doing` says what was attempted.
// Returns its stat.
struct stat CheckOwnSegment(const ArgChecker& check, int fd, const std::string& name,
                            const char* doing) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    check.Fail("cannot stat shared-memory segment " + Quoted(name) + ": " + Errno(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    check.Fail("shared-memory segment " + Quoted(name) + " is not a regular shared-memory file; " +
               "refusing to " + doing + " it");
  }
  const uid_t self = ::geteuid();
  if (st.st_uid != self) {
    check.Fail("shared-memory segment " + Quoted(name) + " is owned by uid " +
               std::to_string(st.st_uid) + ", not by this process's uid " + std::to_string(self) +
               "; refusing to " + doing + " a segment another user created");
  }
  if ((st.st_mode & 077) != 0) {
    check.Fail("shared-memory segment " + Quoted(name) + " has mode " + Octal(st.st_mode) +
               ": other users may read or write it (set_data_ipc creates segments with mode "
               "0600); refusing to " +
               doing + " it");
  }
  return st;
}

// Creates segment `name` of `bytes` bytes with mode 0600, exclusively, and maps it. A
// segment of that name owned by this uid (a stale one left by a crashed creator) is
// unlinked first; processes that still map it keep their memory. One owned by another
// user is refused. Unlinks the new segment again if anything fails.
// The returned mapping's data() is `data_offset` bytes into the segment.
std::shared_ptr<HostMapping> CreateSegment(const ArgChecker& check, const std::string& name,
                                           size_t bytes, uint64_t data_offset, size_t data_bytes) {
  {
    Fd existing(::shm_open(name.c_str(), O_RDONLY | O_NONBLOCK, 0));
    if (existing.get() >= 0) {
      struct stat st {};
      if (::fstat(existing.get(), &st) != 0) {
        check.Fail("cannot stat the existing shared-memory segment " + Quoted(name) + ": " +
                   Errno(errno));
      }
      if (st.st_uid != ::geteuid()) {
        check.Fail("a shared-memory segment " + Quoted(name) +
                   " already exists and is owned by uid " + std::to_string(st.st_uid) +
                   ", not by this process's uid " + std::to_string(::geteuid()) +
                   "; refusing to replace another user's segment");
      }
    } else if (errno == EACCES) {
      check.Fail("a shared-memory segment " + Quoted(name) +
                 " already exists and this process may not open it (another user's); refusing "
                 "to replace it");
    } else if (errno != ENOENT) {
      check.Fail("cannot open the existing shared-memory segment " + Quoted(name) + ": " +
                 Errno(errno));
    }
  }
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    check.Fail("cannot replace the existing shared-memory segment " + Quoted(name) + ": " +
               Errno(errno));
  }
  Fd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  if (fd.get() < 0) {
    check.Fail("cannot create shared-memory segment " + Quoted(name) +
               (errno == EEXIST ? " exclusively: another process created it meanwhile"
                                : ": " + Errno(errno)));
  }
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::shm_unlink(name.c_str());
    check.Fail(what + " for shared-memory segment " + Quoted(name) + " (" + std::to_string(bytes) +
               " bytes) failed: " + Errno(err));
  };
  if (::fchmod(fd.get(), 0600) != 0) fail("fchmod");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) fail("ftruncate");
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) fail("mmap");
  return std::make_shared<HostMapping>(base, bytes, data_offset, data_bytes);
}

// The descriptor of an attached segment of `size` bytes, field by field: every value is
// one that set_data_ipc writes, and the shared bytes lie inside what they claim.
void CheckHeader(const ArgChecker& check, const std::string& name, const SegmentHeader& h,
                 size_t size) {
  const std::string segment = "shared-memory segment " + Quoted(name);
  if (h.version != kVersion) {
    check.Fail(segment + " has layout version " + std::to_string(h.version) +
               "; this build reads version " + std::to_string(kVersion));
  }
  if (h.kind != kHostData && h.kind != kCudaHandle && h.kind != kXpuHandle) {
    check.Fail(segment + " has an unknown kind " + std::to_string(h.kind) +
               " (not written by set_data_ipc)");
  }
  const size_t element = h.dtype >= 0 && h.dtype < static_cast<int32_t>(DType::kUnsupported)
                             ? ElementBytes(static_cast<DType>(h.dtype))
                             : 0;
  if (element == 0) {
    check.Fail(segment + " has an invalid dtype code " + std::to_string(h.dtype) +
               " (not written by set_data_ipc)");
  }
  if (h.device_id < 0 || h.device_id >= kMaxDeviceId || (h.kind == kHostData && h.device_id != 0)) {
    check.Fail(segment + " has an invalid device id " + std::to_string(h.device_id));
  }
  if (h.creator_pid <= 0 || h.creator_pid > INT32_MAX) {
    check.Fail(segment + " has an invalid creator pid " + std::to_string(h.creator_pid));
  }
  uint64_t end = 0;
  if (h.data_bytes % element != 0 || h.data_bytes > static_cast<uint64_t>(kMaxElements) ||
      __builtin_add_overflow(h.data_offset, h.data_bytes, &end)) {
    check.Fail(segment + " has an invalid data range (offset " + std::to_string(h.data_offset) +
               ", " + std::to_string(h.data_bytes) + " bytes)");
  }
  if (h.kind == kHostData) {
    if (h.data_offset < sizeof(SegmentHeader) || h.data_offset % kHostDataOffset != 0) {
      check.Fail(segment + " places its data at offset " + std::to_string(h.data_offset) +
                 "; set_data_ipc writes it page aligned after the " +
                 std::to_string(sizeof(SegmentHeader)) + "-byte header");
    }
    if (end > size) {
      check.Fail(segment + " is truncated (" + std::to_string(size) + " bytes for " +
                 std::to_string(h.data_bytes) + " data bytes at offset " +
                 std::to_string(h.data_offset) + ")");
    }
  }
  if (h.kind == kXpuHandle && h.data_offset != 0) {
    check.Fail(segment + " has data offset " + std::to_string(h.data_offset) +
               "; an XPU handle segment has offset 0");
  }
}

// Publishes a CUDA or XPU handle segment for `t` (its process's mapping is dropped).
void PublishHandle(const ArgChecker& check, const std::string& name, const TensorRef& t,
                   uint32_t kind, const uint8_t* handle, uint64_t offset, size_t bytes);

void Publish(SegmentHeader* header) {
  header->version = kVersion;
  header->creator_pid = static_cast<int64_t>(::getpid());
  __atomic_store_n(&header->magic, kMagic, __ATOMIC_RELEASE);
}

void PublishHandle(const ArgChecker& check, const std::string& name, const TensorRef& t,
                   uint32_t kind, const uint8_t* handle, uint64_t offset, size_t bytes) {
  auto segment = CreateSegment(check, name, sizeof(SegmentHeader), 0, 0);
  SegmentHeader* header = segment->header();
  std::memcpy(header->cuda_handle, handle, kCudaHandleBytes);
  header->kind = kind;
  header->dtype = static_cast<int32_t>(t.dtype);
  header->device_id = t.device_id;
  header->data_bytes = bytes;
  header->data_offset = offset;
  header->data_ptr_addr = kind == kXpuHandle ? reinterpret_cast<uintptr_t>(t.data) : 0;
  Publish(header);
}

}  // namespace

void CheckName(const ArgChecker& check, const std::string& name) {
  if (name.empty()) check.Fail("`shm_name` is empty");
  if (name.size() > 255) {
    check.Fail("`shm_name` is " + std::to_string(name.size()) + " bytes long; at most 255");
  }
  if (name.find('/') != std::string::npos) {
    check.Fail("`shm_name` " + Quoted(name) +
               " contains '/'; a shared-memory name is one path component (no slash)");
  }
  if (name.find('\0') != std::string::npos) check.Fail("`shm_name` contains a NUL byte");
}

}  // namespace ipc

std::shared_ptr<ipc::SharedBuffer> SetDataIpc(const TensorRef& tmp_input,
                                              const std::string& shm_name) {
  using namespace ipc;
  const ArgChecker check("set_data_ipc");
  CheckName(check, shm_name);
  CheckShareableDtype(check, tmp_input);
  CheckDevice(check, tmp_input);
  if (!tmp_input.contiguous) {
    // A strided view: the shared bytes would be a copy that the creator's tensor never
    // sees again (nor sees the attachers' writes).
    check.Fail("`tmp_input` is not contiguous (a strided view, shape " + tmp_input.ShapeString() +
               "); share a contiguous tensor, else creator and attachers would not see each "
               "other's writes");
  }
  check.Storage(tmp_input);
  const size_t bytes = static_cast<size_t>(tmp_input.numel()) * ElementBytes(tmp_input.dtype);
  const Where where = Locate(tmp_input);

  if (where == Where::kXpu) {
    // XPU: the handle of the tensor's device memory; XRE's handle is taken of the pointer
    // itself, so the offset is 0 (upstream stores tmp_input.data() the same way).
    static_assert(xpu::kIpcHandleBytes == kCudaHandleBytes, "the handle fits upstream's slot");
    uint8_t handle[kCudaHandleBytes] = {};
    if (xpu::IpcGetMemHandle(tmp_input.data, handle) != xpu::kSuccess) {
      check.Fail("cannot export `tmp_input`: " + xpu::LastError());
    }
    PublishHandle(check, shm_name, tmp_input, kXpuHandle, handle, 0, bytes);
    return nullptr;
  }

  if (where == Where::kHost) {
    auto segment = CreateSegment(check, shm_name, kHostDataOffset + bytes, kHostDataOffset, bytes);
    SegmentHeader* header = segment->header();
    header->kind = kHostData;
    header->dtype = static_cast<int32_t>(tmp_input.dtype);
    header->data_bytes = bytes;
    header->data_offset = kHostDataOffset;
    if (bytes != 0) std::memcpy(segment->data(), tmp_input.data, bytes);
    Publish(header);
    return segment;
  }

  // CUDA: the handle of the allocation holding the tensor, and the tensor's offset in it
  // (an allocator may hand out the middle of a larger cudaMalloc block).
  uint8_t handle[kCudaHandleBytes] = {};
  uint64_t offset = 0;
#if defined(FDMTP_WITH_CUDA)
  CheckCuda(check, cuda::IpcGetMemHandle(tmp_input.data, handle, &offset), "cudaIpcGetMemHandle");
#else
  CheckCuda(check, 1, "cudaIpcGetMemHandle");
#endif
  PublishHandle(check, shm_name, tmp_input, kCudaHandle, handle, offset, bytes);
  return nullptr;  // the segment stays (until unlinked); this process's mapping is dropped
}

std::shared_ptr<ipc::SharedBuffer> ShareExternalData(const TensorRef& input,
                                                     const std::string& shm_name,
                                                     const std::vector<int64_t>& shape,
                                                     bool use_ipc) {
  using namespace ipc;
  const ArgChecker check("share_external_data");
  CheckName(check, shm_name);
  CheckShareableDtype(check, input);
  CheckDevice(check, input);
  const Where where = Locate(input);
  if (!use_ipc && where != Where::kXpu) {
    check.Fail(
        "`use_ipc`=False reuses the creator's XPU device pointer and applies to XPU "
        "tensors only; `input` is " +
        Placement(input));
  }
  std::string shape_text;
  const size_t want = ShapeBytes(check, input.dtype, shape, &shape_text);

  Fd fd(::shm_open(shm_name.c_str(), O_RDWR | O_NONBLOCK, 0));
  if (fd.get() < 0) {
    if (errno == ENOENT) {
      check.Fail("no shared-memory segment named " + Quoted(shm_name) +
                 " (not created yet by set_data_ipc, or already unlinked)");
    }
    check.Fail("cannot open shared-memory segment " + Quoted(shm_name) + ": " + Errno(errno));
  }
  const struct stat st = CheckOwnSegment(check, fd.get(), shm_name, "attach");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kUpstreamBytes) {
    check.Fail("shared-memory segment " + Quoted(shm_name) + " holds " + std::to_string(size) +
               " bytes: not a tensor segment written by set_data_ipc");
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    check.Fail("mmap of shared-memory segment " + Quoted(shm_name) + " failed: " + Errno(errno));
  }
  auto whole = std::make_shared<HostMapping>(base, size, 0, size);
  const bool ours = size >= sizeof(SegmentHeader) &&
                    __atomic_load_n(&whole->header()->magic, __ATOMIC_ACQUIRE) == kMagic;
  // A 72-byte segment is upstream FastDeploy's CUDA handle record: no dtype or size to check.
  const bool upstream_cuda = size == kUpstreamBytes;
  if (!ours && !upstream_cuda) {
    check.Fail("shared-memory segment " + Quoted(shm_name) +
               " is not a complete tensor segment (its creator has not finished set_data_ipc, "
               "or it was not written by set_data_ipc)");
  }
  // Checked and used from one copy: what the checks passed is what is used.
  SegmentHeader h{};
  std::memcpy(&h, whole->header(), ours ? sizeof(SegmentHeader) : kUpstreamBytes);
  if (ours) {
    CheckHeader(check, shm_name, h, size);
    if (h.kind != KindOf(where)) {
      check.Fail("shared-memory segment " + Quoted(shm_name) + " holds " + Holds(h.kind) +
                 " but `input` is " + Placement(input) + "; attach with a placeholder on " +
                 AttachOn(h.kind));
    }
    if (h.dtype != static_cast<int32_t>(input.dtype)) {
      check.Fail("dtype mismatch: `input` is " + std::string(DTypeName(input.dtype)) +
                 " but segment " + Quoted(shm_name) + " holds a " +
                 DTypeName(static_cast<DType>(h.dtype)) + " tensor");
    }
    if (want > h.data_bytes) {
      check.Fail("`shape` " + shape_text + " needs " + std::to_string(want) +
                 " bytes but segment " + Quoted(shm_name) + " holds " +
                 std::to_string(h.data_bytes) + " bytes");
    }
  } else if (where != Where::kCuda) {
    check.Fail("shared-memory segment " + Quoted(shm_name) +
               " is an upstream CUDA handle record; attach it with a CUDA placeholder");
  }

  if (where == Where::kXpu) {
    const int64_t creator = h.creator_pid;
    const int64_t self = static_cast<int64_t>(::getpid());
    if (!use_ipc) {
      // Upstream's use_ipc=False: the stored pointer, which means something only in the
      // creator's address space.
      if (creator != self) {
        check.Fail(
            "`use_ipc`=False reuses the device pointer stored by the creator, valid only "
            "in the creating process (pid " +
            std::to_string(creator) + "), but this is pid " + std::to_string(self) +
            "; attach with use_ipc=True");
      }
      void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(h.data_ptr_addr));
      if (!xpu::MaybeLiveDeviceMemory(ptr, want)) {
        check.Fail("`use_ipc`=False: the device memory published as " + Quoted(shm_name) +
                   " is no longer allocated (" + std::to_string(want) +
                   " bytes at the stored pointer); the creator's tensor was freed");
      }
      return std::make_shared<XpuMapping>(ptr, 0, want, input.device_id, false);
    }
    uint8_t handle[kCudaHandleBytes];
    std::memcpy(handle, h.cuda_handle, kCudaHandleBytes);
    void* ptr = nullptr;
    if (xpu::IpcOpenMemHandle(handle, input.device_id, &ptr) != xpu::kSuccess) {
      check.Fail(xpu::LastError() +
                 (creator == self ? "; in the creating process attach with use_ipc=False" : ""));
    }
    return std::make_shared<XpuMapping>(ptr, h.data_offset, want, input.device_id, true);
  }

  if (where == Where::kHost) {
    auto view = std::make_shared<HostMapping>(base, size, h.data_offset, want);
    whole->Release();
    return view;
  }
#if defined(FDMTP_WITH_CUDA)
  uint8_t handle[kCudaHandleBytes];
  std::memcpy(handle, h.cuda_handle, kCudaHandleBytes);
  const uint64_t offset = ours ? h.data_offset : 0;
  void* device_base = nullptr;
  CheckCuda(check, cuda::IpcOpenMemHandle(handle, input.device_id, &device_base),
            "cudaIpcOpenMemHandle");
  return std::make_shared<CudaMapping>(device_base, offset, want, input.device_id);
#else
  CheckCuda(check, 1, "cudaIpcOpenMemHandle");
  return nullptr;
#endif
}

void UnsetDataIpc(const TensorRef& tmp_input, const std::string& shm_name, bool unlink_shm) {
  const ArgChecker check("unset_data_ipc");
  ipc::CheckName(check, shm_name);
  (void)tmp_input;
  if (unlink_shm && ::shm_unlink(shm_name.c_str()) != 0 && errno != ENOENT) {
    check.Fail("cannot unlink shared-memory segment `" + shm_name + "`: " + std::strerror(errno));
  }
}

}  // namespace fdmtp
