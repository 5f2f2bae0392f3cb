// The emulated XRE allocation and IPC calls (see xre_emu.h).
#include "xpu/emu/xre_emu.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace fdmtp {
namespace xpu_emu {
namespace {

constexpr uint32_t kHandleMagic = 0x554d4558;  // "XEMU" little-endian
constexpr int kEmulatedDevices = 8;

// What the 64 handle bytes hold.
struct HandleRecord {
  uint32_t magic;
  int32_t pid;      // exporter
  uint64_t bytes;   // the region (allocation) size
  uint64_t offset;  // the exported pointer's offset in it
  char name[40];    // the region's shm name, NUL-terminated
};
static_assert(sizeof(HandleRecord) == sizeof(XPUIpcMemHandle), "a handle is 64 bytes");

struct Region {
  std::string name;
  uint64_t bytes;
  void* base;
  size_t mapped;
};

std::mutex g_mutex;
std::map<uintptr_t, Region> g_allocations;  // xpu_malloc'd, by base address
std::map<uintptr_t, Region> g_opened;       // xpu_ipc_open_memhandle'd, by returned pointer
std::atomic<uint64_t> g_sequence{0};
thread_local std::string t_error;
thread_local int t_device = 0;

int Fail(int code, const std::string& message) {
  t_error = message;
  return code;
}

std::string Errno() { return std::strerror(errno); }

// The allocation holding [p, p + bytes), or end(). Caller holds g_mutex.
std::map<uintptr_t, Region>::const_iterator Find(const void* p, uint64_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(addr);
  if (it == g_allocations.begin()) return g_allocations.end();
  --it;
  const uint64_t offset = addr - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return g_allocations.end();
  if (offset == it->second.bytes && bytes != 0) return g_allocations.end();
  return it;
}

// Maps shm region `name` of at least `bytes` bytes; base == nullptr on failure (t_error set).
void* MapRegion(int fd, const std::string& name, uint64_t bytes, size_t* mapped) {
  *mapped = bytes == 0 ? 1 : static_cast<size_t>(bytes);
  void* base = ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    t_error = "mmap of emulated device region `" + name + "` failed: " + Errno();
    return nullptr;
  }
  return base;
}

// Unmaps the region registered in `regions` under `ptr` (and unlinks its name: xpu_free).
int Unmap(std::map<uintptr_t, Region>* regions, void* ptr, bool unlink, const char* unknown) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = regions->find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regions->end()) return Fail(XPUERR_INVALID_VALUE, unknown);
  ::munmap(it->second.base, it->second.mapped);
  if (unlink) ::shm_unlink(it->second.name.c_str());
  regions->erase(it);
  return XPU_SUCCESS;
}

}  // namespace

const std::string& LastXreError() { return t_error; }

int xpu_malloc(void** ptr, uint64_t size) {
  *ptr = nullptr;
  const std::string name =
      "fdmtpxe." + std::to_string(::getpid()) + "." + std::to_string(g_sequence.fetch_add(1));
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Left by a killed process that had our pid (sequence numbers are unique within a
    // process): that process is gone, so the region is stale.
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0)
    return Fail(XPUERR_NOMEM, "cannot create emulated device region `" + name + "`: " + Errno());
  size_t mapped = 0;
  void* base = nullptr;
  if (::ftruncate(fd, static_cast<off_t>(size == 0 ? 1 : size)) != 0) {
    t_error = "ftruncate of emulated device region `" + name + "` failed: " + Errno();
  } else {
    base = MapRegion(fd, name, size, &mapped);
  }
  ::close(fd);
  if (base == nullptr) {
    ::shm_unlink(name.c_str());
    return XPUERR_NOMEM;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(base)] = Region{name, size, base, mapped};
  *ptr = base;
  return XPU_SUCCESS;
}

int xpu_free(void* ptr) {
  return Unmap(&g_allocations, ptr, true,
               "xpu_free: the pointer is not the start of an xpu_malloc allocation");
}

int xpu_current_device(int* device) {
  *device = t_device;
  return XPU_SUCCESS;
}

int xpu_set_device(int device) {
  if (device < 0 || device >= kEmulatedDevices) {
    return Fail(XPUERR_INVALID_VALUE, "xpu_set_device: no emulated device " +
                                          std::to_string(device) + " (0.." +
                                          std::to_string(kEmulatedDevices - 1) + ")");
  }
  t_device = device;
  return XPU_SUCCESS;
}

int xpu_ipc_get_memhandle(XPUIpcMemHandle* handle, void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = Find(ptr, 0);
  if (it == g_allocations.end()) {
    return Fail(
        XPUERR_INVALID_VALUE,
        "the pointer is not in device memory allocated by this process (emulated xpu_malloc)");
  }
  HandleRecord record{};
  record.magic = kHandleMagic;
  record.pid = static_cast<int32_t>(::getpid());
  record.bytes = it->second.bytes;
  record.offset = reinterpret_cast<uintptr_t>(ptr) - it->first;
  std::strncpy(record.name, it->second.name.c_str(), sizeof(record.name) - 1);
  std::memcpy(handle, &record, sizeof(record));
  return XPU_SUCCESS;
}

int xpu_ipc_open_memhandle(void** ptr, XPUIpcMemHandle handle, int flags) {
  (void)flags;  // XRE's lazy-peer-access flag; nothing to enable here
  *ptr = nullptr;
  HandleRecord record;
  std::memcpy(&record, &handle, sizeof(record));
  record.name[sizeof(record.name) - 1] = '\0';
  if (record.magic != kHandleMagic || record.offset > record.bytes) {
    return Fail(XPUERR_INVALID_HANDLE,
                "not an IPC handle written by (emulated) xpu_ipc_get_memhandle");
  }
  if (record.pid == static_cast<int32_t>(::getpid())) {
    return Fail(XPUERR_INVALID_HANDLE, "the handle was exported by this process (pid " +
                                           std::to_string(record.pid) +
                                           "); an IPC handle opens in other processes only");
  }
  const std::string name = record.name;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return Fail(XPUERR_INVALID_HANDLE,
                "the allocation behind the handle is gone (freed, or its process pid " +
                    std::to_string(record.pid) + " exited): " + Errno());
  }
  struct stat st {};
  size_t mapped = 0;
  void* base = nullptr;
  if (::fstat(fd, &st) != 0) {
    t_error = "cannot stat emulated device region `" + name + "`: " + Errno();
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    // xpu_malloc creates regions with mode 0600: anything else was not made by this user's
    // processes (another user may read or write it).
    t_error = "emulated device region `" + name + "` is not a mode-0600 region of uid " +
              std::to_string(::geteuid()) + " (owner uid " + std::to_string(st.st_uid) +
              "); refusing to open it";
  } else if (static_cast<uint64_t>(st.st_size) < (record.bytes == 0 ? 1 : record.bytes)) {
    t_error = "emulated device region `" + name + "` is smaller than its handle says";
  } else {
    base = MapRegion(fd, name, record.bytes, &mapped);
  }
  ::close(fd);
  if (base == nullptr) return XPUERR_INVALID_HANDLE;
  void* p = static_cast<char*>(base) + record.offset;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_opened[reinterpret_cast<uintptr_t>(p)] = Region{name, record.bytes, base, mapped};
  *ptr = p;
  return XPU_SUCCESS;
}

int xpu_ipc_close_memhandle(void* ptr) {
  return Unmap(&g_opened, ptr, false,
               "xpu_ipc_close_memhandle: the pointer was not returned by xpu_ipc_open_memhandle");
}

bool IsLiveAllocation(const void* ptr, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return Find(ptr, bytes) != g_allocations.end();
}

}  // namespace xpu_emu
}  // namespace fdmtp
