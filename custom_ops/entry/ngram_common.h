// Shared by the entries of the two n-gram ops: attr checks and the dispatch that provides
// the CUDA launchers with their scratch.
#pragma once

#include <string>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace ngram_entry {

inline void AttrAtLeast(const ArgChecker& check, const char* name, int64_t value, int64_t min) {
  if (value < min) {
    check.Fail(std::string("attr `") + name + "` must be >= " + std::to_string(min) + ", got " +
               std::to_string(value));
  }
}

// The batch size, from `slt`; `t` must be a [bsz, width] matrix.
inline void RowsMatch(const ArgChecker& check, const TensorRef& t, const TensorRef& slt) {
  check.Rank(t, 2);
  check.DimEq(t, 0, slt, 0);
}

template <typename CpuFn, typename CudaFn, typename XpuFn>
void Run(const ArgChecker& check, Device device, int64_t bsz, ScratchAllocator* scratch,
         CpuFn&& cpu_fn, CudaFn&& cuda_fn, XpuFn&& xpu_fn) {
  Dispatch(
      check, device, cpu_fn, [&]() -> int {
#if defined(FDMTP_WITH_CUDA)
    if (bsz == 0) return 0;
    if (scratch == nullptr) check.Fail("internal: no scratch allocator for a CUDA call");
    void* workspace = scratch->Allocate(cuda::NgramWorkspaceBytes(bsz));
    if (workspace == nullptr) check.Fail("could not allocate the CUDA scratch");
    return cuda_fn(workspace);
#else
    (void)bsz;
    (void)scratch;
    (void)cuda_fn;
    return 0;
#endif
      },
      xpu_fn);
}

}  // namespace ngram_entry
}  // namespace fdmtp
