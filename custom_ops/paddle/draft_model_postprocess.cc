// Paddle binding of draft_model_postprocess: FastDeploy's inputs, outputs and in-place map.
#include "tensor_ref.h"

namespace {

void DraftModelPostprocess(const paddle::Tensor& base_model_draft_tokens,
                           const paddle::Tensor& base_model_seq_lens_this_time,
                           const paddle::Tensor& base_model_seq_lens_encoder,
                           const paddle::Tensor& base_model_stop_flags) {
  namespace pb = fdmtp::paddle_binding;
  pb::RunEntry([&] {
    fdmtp::DraftModelPostprocess(
        FDMTP_REF(base_model_draft_tokens),
        FDMTP_REF(base_model_seq_lens_this_time),
        FDMTP_REF(base_model_seq_lens_encoder),
        FDMTP_REF(base_model_stop_flags),
        pb::StreamOf(base_model_seq_lens_this_time));
  });
}

}  // namespace

PD_BUILD_OP(draft_model_postprocess)
    .Inputs({"base_model_draft_tokens", "base_model_seq_lens_this_time",
             "base_model_seq_lens_encoder", "base_model_stop_flags"})
    .Outputs({"base_model_draft_tokens_out", "base_model_seq_lens_this_time_out",
              "base_model_stop_flags_out"})
    .SetInplaceMap({{"base_model_draft_tokens", "base_model_draft_tokens_out"},
                    {"base_model_seq_lens_this_time", "base_model_seq_lens_this_time_out"},
                    {"base_model_stop_flags", "base_model_stop_flags_out"}})
    .SetKernelFn(PD_KERNEL(DraftModelPostprocess));
