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
        pb::ToRef(draft_logits, "draft_logits"), pb::ToRef(next_token_num, "next_token_num"),
        pb::ToRef(batch_token_num, "batch_token_num"),
        pb::ToRef(cu_next_token_offset, "cu_next_token_offset"),
        pb::ToRef(cu_batch_token_offset, "cu_batch_token_offset"), pb::ToRef(logits, "logits"),
        pb::ToRef(first_token_logits, "first_token_logits"),
        pb::ToRef(seq_lens_this_time, "seq_lens_this_time"),
        pb::ToRef(seq_lens_encoder, "seq_lens_encoder"), pb::StreamOf(draft_logits));
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
