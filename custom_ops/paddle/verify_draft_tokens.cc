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
        pb::ToRef(step_output_ids, "step_output_ids"), pb::ToRef(step_output_len, "step_output_len"),
        pb::ToRef(step_input_ids, "step_input_ids"),
        pb::ToOptionalRef(target_tokens, "target_tokens"),
        pb::ToOptionalRef(candidate_ids, "candidate_ids"),
        pb::ToOptionalRef(candidate_scores, "candidate_scores"),
        pb::ToOptionalRef(candidate_lens, "candidate_lens"), pb::ToRef(topp, "topp"),
        pb::ToRef(stop_flags, "stop_flags"), pb::ToRef(seq_lens_encoder, "seq_lens_encoder"),
        pb::ToRef(seq_lens_this_time, "seq_lens_this_time"), pb::ToRef(end_tokens, "end_tokens"),
        pb::ToRef(is_block_step, "is_block_step"),
        pb::ToRef(cu_seqlens_q_output, "cu_seqlens_q_output"),
        pb::ToRef(reasoning_status, "reasoning_status"), pb::ToRef(max_dec_len, "max_dec_len"),
        pb::ToRef(step_idx, "step_idx"), pb::ToOptionalRef(verify_uniforms, "verify_uniforms"),
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
