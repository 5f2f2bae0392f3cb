// The host side of an emulated XPU3 launch (the wrappers, wrapper/wrapper.h): no KP
// dialect here, only the call into a kernel's emulator entry.
//
// Kernel units are compiled as XPU device code (-DFDMTP_XPU_DEVICE_CODE, `fdmtp` renamed
// to `fdmtp_xpuemu`, see kp_emu.h), so their argument structs are distinct types from the
// host's. A launch therefore passes each argument as bytes, as the real runtime copies
// kernel arguments into the device's parameter buffer: the host lists the addresses and
// sizes of its arguments, and the kernel's entry (FDMTP_XPU_EMU_ENTRY in kp_emu.h) checks
// the count and sizes against the kernel's parameter types and copies them in.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>

namespace fdmtp_kpemu {

struct KernelParams {
  int clusters = 0;
  int cores = 0;
  const void* const* values = nullptr;  // the host arguments, in order
  const size_t* sizes = nullptr;        // their sizes in bytes
  size_t count = 0;
  std::string* error = nullptr;  // set when the launch fails
};

// A kernel's emulator entry: returns 0, or 1 with *params.error set.
using KernelEntry = int (*)(const KernelParams& params);

// Runs `body` on clusters x cores emulated cores (kp_emu.cc). Returns 0, or 1 with *error set.
int Launch(int clusters, int cores, const char* kernel, const std::function<void()>& body,
           std::string* error);

template <typename... A>
int HostLaunch(int clusters, int cores, KernelEntry entry, std::string* error, const A&... args) {
  const std::array<const void*, sizeof...(A) + 1> values{
      {static_cast<const void*>(&args)..., nullptr}};
  const std::array<size_t, sizeof...(A) + 1> sizes{{sizeof(A)..., 0}};
  KernelParams p;
  p.clusters = clusters;
  p.cores = cores;
  p.values = values.data();
  p.sizes = sizes.data();
  p.count = sizeof...(A);
  p.error = error;
  return entry(p);
}

}  // namespace fdmtp_kpemu

// The emulator entry of kernel `name` (defined next to the kernel by FDMTP_XPU_EMU_ENTRY).
#define FDMTP_XPU_EMU_ENTRY_NAME(name) fdmtp_xpu_emu_entry_##name
#define FDMTP_XPU_EMU_ENTRY_DECL(name) \
  int FDMTP_XPU_EMU_ENTRY_NAME(name)(const ::fdmtp_kpemu::KernelParams& params)
