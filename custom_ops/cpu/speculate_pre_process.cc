#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void SpeculatePreProcess(const SpeculatePreProcessArgs& args) {
  for (int64_t t = 0; t < args.token_num; ++t) {
    args.ids_remove_padding[t] = kPaddingTokenFill;
    args.batch_id_per_token[t] = kNoBatchId;
  }
  for (int64_t r = 0; r < args.output_capacity; ++r) args.batch_id_per_token_output[r] = kNoBatchId;
  int64_t in_total = 0;
  int64_t out_total = 0;
  args.cu_seqlens_q[0] = 0;
  args.cu_seqlens_k[0] = 0;
  args.cu_seq_lens_q_output[0] = 0;
  for (int64_t b = 0; b < args.bsz; ++b) {
    in_total += SpeculateInputTokens(args, b);
    out_total += SpeculateOutputRows(args, b);
    args.cu_seqlens_q[b + 1] = static_cast<int32_t>(in_total);
    args.cu_seqlens_k[b + 1] = static_cast<int32_t>(in_total);
    args.cu_seq_lens_q_output[b + 1] = static_cast<int32_t>(out_total);
  }
  *args.real_output_token_num = static_cast<int32_t>(out_total);
  for (int64_t b = 0; b < args.bsz; ++b) {
    for (int64_t i = 0; i < SpeculateInputTokens(args, b); ++i) SpeculatePreProcessToken(args, b, i);
    for (int64_t j = 0; j < SpeculateOutputRows(args, b); ++j) SpeculatePreProcessOutputRow(args, b, j);
  }
}

}  // namespace cpu
}  // namespace fdmtp
