// Paddle binding of speculate_get_logits: FastDeploy's inputs and in-place outputs, plus
// next_token_num_out and cu_next_token_offset_out, which upstream writes without declaring
// them (compat.md deviation 4); the extra outputs come after FastDeploy's.
#include "tensor_ref.h"

namespace {

void SpeculateGetLogits(const paddle::Tensor& draft_logits, const paddle::Tensor& next_token_num,
                        const paddle::Tensor& batch_token_num,
                        const paddle::Tensor& cu_next_token_offset,
                        const paddle::Tensor& cu_batch_token_offset, const paddle::Tensor& logits,
                        const paddle::Tensor& first_token_logits,
                        const paddle::Tensor& seq_lens_this_time,
                        const paddle::Tensor& seq_lens_encoder) {
  namespace pb = fdmtp::paddle_binding;
  pb::RunEntry([&] {
    fdmtp::SpeculateGetLogits(
        FDMTP_REF(draft_logits), FDMTP_REF(next_token_num),
        FDMTP_REF(batch_token_num),
        FDMTP_REF(cu_next_token_offset),
        FDMTP_REF(cu_batch_token_offset), FDMTP_REF(logits),
        FDMTP_REF(first_token_logits),
        FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_encoder), pb::StreamOf(draft_logits));
  });
}

}  // namespace

PD_BUILD_OP(speculate_get_logits)
    .Inputs({"draft_logits", "next_token_num", "batch_token_num", "cu_next_token_offset",
             "cu_batch_token_offset", "logits", "first_token_logits", "seq_lens_this_time",
             "seq_lens_encoder"})
    .Outputs({"draft_logits_out", "batch_token_num_out", "cu_batch_token_offset_out",
              "next_token_num_out", "cu_next_token_offset_out"})
    .SetInplaceMap({{"draft_logits", "draft_logits_out"},
                    {"batch_token_num", "batch_token_num_out"},
                    {"cu_batch_token_offset", "cu_batch_token_offset_out"},
                    {"next_token_num", "next_token_num_out"},
                    {"cu_next_token_offset", "cu_next_token_offset_out"}})
    .SetKernelFn(PD_KERNEL(SpeculateGetLogits));
