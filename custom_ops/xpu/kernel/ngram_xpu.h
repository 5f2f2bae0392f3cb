// The XPU3 body shared by hybrid_mtp_ngram and ngram_match (the three phases of
// fdmtp/ngram_common.h). Phase 2 is ordered over the batch and phase 3 rewrites
// seq_lens_this_time, which phase 2 reads, so one cluster does all the work (clusters
// cannot synchronise); other clusters return. Its cores search items in parallel into
// shared memory, core 0 applies the threshold in batch order, then the cores write.
#pragma once

#include "kp.h"

namespace fdmtp_xpu3 {

// Item b of the op, rebuilt from the tensors (NgramCapBatch's item_at).
template <typename Op>
struct NgramItemAt {
  const typename Op::Args& args;
  __device__ fdmtp::NgramItem operator()(int64_t b) const { return Op::Item(args, b); }
};

template <typename Op>
__device__ inline void RunNgram(const typename Op::Args& args, int64_t bsz, int max_n, int min_n,
                                int64_t threshold, FDMTP_SM fdmtp::NgramProposal* sm_proposals,
                                FDMTP_SM int32_t* sm_counts) {
  if (cluster_id() != 0) return;
  for (int64_t b = core_id(); b < bsz; b += core_num()) {
    sm_proposals[b] =
        fdmtp::NgramProposeItem(fdmtp::NgramFindNextScalarFn(), Op::Item(args, b), max_n, min_n);
  }
  mfence();
  sync_cluster();
  if (core_id() == 0) {
    fdmtp::NgramCapBatch(NgramItemAt<Op>{args}, sm_proposals, bsz, threshold, sm_counts);
  }
  mfence();
  sync_cluster();
  for (int64_t b = core_id(); b < bsz; b += core_num()) {
    Op::Write(args, b, Op::Item(args, b), sm_proposals[b], sm_counts[b]);
  }
}

#define FDMTP_XPU_NGRAM_SHARED                                                       \
  __shared__ fdmtp::NgramProposal sm_proposals[lim::kMaxNgramBatch];                 \
  __shared__ int32_t sm_counts[lim::kMaxNgramBatch];                                 \
  static_assert(sizeof(fdmtp::NgramProposal) == 16, "kNgramSharedBytes assumes 16"); \
  static_assert(lim::kNgramSharedBytes <= lim::kSharedMemBytes, "n-gram: shared memory")

}  // namespace fdmtp_xpu3
