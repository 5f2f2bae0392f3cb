// The XPU3 body of a row-gather plan (see fdmtp/row_gather.h), shared by the three eagle_*
// kernels. Every cluster computes the items' input and output row offsets (prefix sums of
// the shared per-item counts) in its shared memory; then each core takes items strided
// over all cores and copies their output rows through local memory, or zeroes rows with no
// source; rows past the total are zeroed. Inputs are not written, so clusters need not
// agree on anything but the (identical) offsets they each compute.
#pragma once

#include "kp.h"

namespace fdmtp_xpu3 {

// The input / output row counts of item b (ClusterExclusiveScan's values).
template <typename Plan>
struct RowsIn {
  const Plan& plan;
  __device__ int64_t operator()(int64_t b) const { return plan.Counts(b).in; }
};
template <typename Plan>
struct RowsOut {
  const Plan& plan;
  __device__ int64_t operator()(int64_t b) const { return plan.Counts(b).out; }
};

template <typename Plan>
__device__ inline void GatherRows(const Plan& plan, int64_t elem_bytes, FDMTP_SM int64_t* sm_in,
                                  FDMTP_SM int64_t* sm_out, FDMTP_SM int64_t* sm_partial) {
  const fdmtp::RowGatherArgs& r = plan.rows;
  ClusterExclusiveScan(r.bsz, RowsIn<Plan>{plan}, sm_in, sm_partial);
  ClusterExclusiveScan(r.bsz, RowsOut<Plan>{plan}, sm_out, sm_partial);
  const int64_t row_bytes = r.hidden * elem_bytes;
  __global_ptr__ const char* input = static_cast<__global_ptr__ const char*>(r.input);
  __global_ptr__ char* out = static_cast<__global_ptr__ char*>(r.out);
  for (int64_t b = GlobalCore(); b < r.bsz; b += GlobalCores()) {
    const fdmtp::ItemRows c = plan.Counts(b);
    for (int64_t j = 0; row_bytes != 0 && j < c.out && sm_out[b] + j < r.out_rows; ++j) {
      __global_ptr__ char* dst = out + (sm_out[b] + j) * row_bytes;
      const int64_t src = fdmtp::SourceRow(plan.Source(b, j, c), c, sm_in[b], r.in_rows);
      if (src >= 0) {
        CopyGm(dst, input + src * row_bytes, row_bytes);
      } else {
        ZeroGm(dst, row_bytes);
      }
    }
  }
  const int64_t total = sm_out[r.bsz];
  for (int64_t row = total + GlobalCore(); row_bytes != 0 && row < r.out_rows;
       row += GlobalCores()) {
    ZeroGm(out + row * row_bytes, row_bytes);
  }
  if (GlobalCore() == 0) StoreGm(r.output_token_num, fdmtp::SatInt32(total));
}

// The shared buffers of a row-gather kernel.
#define FDMTP_XPU_ROW_GATHER_SHARED                            \
  __shared__ int64_t sm_in[lim::kMaxBatch + 1];                \
  __shared__ int64_t sm_out[lim::kMaxBatch + 1];               \
  __shared__ int64_t sm_partial[lim::kMaxCoresPerCluster + 1]; \
  static_assert(lim::kScanSharedBytes <= lim::kSharedMemBytes, "row gather: shared memory")

}  // namespace fdmtp_xpu3
