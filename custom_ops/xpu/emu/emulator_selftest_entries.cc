// The emulated build's unit for kernel/emulator_selftest.xpu: the kernels compiled as XPU
// device code, plus their emulator entries (the generated xpu_emu/<op>.cc do the same for
// the ops' kernels).
#include "xpu/kernel/emulator_selftest.xpu"

FDMTP_XPU_EMU_ENTRY(emulator_selftest_local_overflow)
FDMTP_XPU_EMU_ENTRY(emulator_selftest_barrier_mismatch)
FDMTP_XPU_EMU_ENTRY(emulator_selftest_missing_mfence)
FDMTP_XPU_EMU_ENTRY(emulator_selftest_foreign_local)
FDMTP_XPU_EMU_ENTRY(emulator_selftest_stack_overflow)
