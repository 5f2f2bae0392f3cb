// Paddle binding of verify_draft_tokens: FastDeploy's 17 inputs (four optional), plus the
// optional verify_uniforms, FastDeploy's attrs and in-place map.
#include "tensor_ref.h"

namespace {

void VerifyDraftTokens(const paddle::Tensor& step_output_ids, const paddle::Tensor& step_output_len,
                       const paddle::Tensor& step_input_ids,
                       const paddle::optional<paddle::Tensor>& target_tokens,
                       const paddle::optional<paddle::Tensor>& candidate_ids,
                       const paddle::optional<paddle::Tensor>& candidate_scores,
                       const paddle::optional<paddle::Tensor>& candidate_lens,
                       const paddle::Tensor& topp, const paddle::Tensor& stop_flags,
                       const paddle::Tensor& seq_lens_encoder,
                       const paddle::Tensor& seq_lens_this_time, const paddle::Tensor& end_tokens,
                       const paddle::Tensor& is_block_step,
                       const paddle::Tensor& cu_seqlens_q_output,
                       const paddle::Tensor& reasoning_status, const paddle::Tensor& max_dec_len,
                       const paddle::Tensor& step_idx,
                       const paddle::optional<paddle::Tensor>& verify_uniforms, int max_seq_len,
                       int verify_window, int verify_strategy, bool reject_all, bool accept_all) {
  namespace pb = fdmtp::paddle_binding;
  pb::RunEntry([&] {
    fdmtp::VerifyDraftTokens(
        FDMTP_REF(step_output_ids), FDMTP_REF(step_output_len),
        FDMTP_REF(step_input_ids),
        FDMTP_OPT_REF(target_tokens),
        FDMTP_OPT_REF(candidate_ids),
        FDMTP_OPT_REF(candidate_scores),
        FDMTP_OPT_REF(candidate_lens), FDMTP_REF(topp),
        FDMTP_REF(stop_flags), FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(seq_lens_this_time), FDMTP_REF(end_tokens),
        FDMTP_REF(is_block_step),
        FDMTP_REF(cu_seqlens_q_output),
        FDMTP_REF(reasoning_status), FDMTP_REF(max_dec_len),
        FDMTP_REF(step_idx), FDMTP_OPT_REF(verify_uniforms),
        max_seq_len, verify_window, verify_strategy, reject_all, accept_all,
        pb::StreamOf(step_output_ids));
  });
}

}  // namespace

PD_BUILD_OP(verify_draft_tokens)
    .Inputs({"step_output_ids", "step_output_len", "step_input_ids",
             paddle::Optional("target_tokens"), paddle::Optional("candidate_ids"),
             paddle::Optional("candidate_scores"), paddle::Optional("candidate_lens"), "topp",
             "stop_flags", "seq_lens_encoder", "seq_lens_this_time", "end_tokens",
             "is_block_step", "cu_seqlens_q_output", "reasoning_status", "max_dec_len",
             "step_idx", paddle::Optional("verify_uniforms")})
    .Outputs({"step_output_ids_out", "step_output_len_out"})
    .Attrs({"max_seq_len: int", "verify_window: int", "verify_strategy: int", "reject_all: bool",
            "accept_all: bool"})
    .SetInplaceMap({{"step_output_ids", "step_output_ids_out"},
                    {"step_output_len", "step_output_len_out"}})
    .SetKernelFn(PD_KERNEL(VerifyDraftTokens));
