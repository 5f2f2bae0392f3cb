// Paddle binding of draft_model_preprocess: FastDeploy develop's 17 inputs, 9 in-place
// outputs and attrs, plus target_model_draft_tokens_out, which upstream writes without
// declaring it (DESIGN.md §2 deviation 4).
#include "tensor_ref.h"

namespace {

void DraftModelPreprocess(
    const paddle::Tensor& draft_tokens, const paddle::Tensor& input_ids,
    const paddle::Tensor& stop_flags, const paddle::Tensor& seq_lens_this_time,
    const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& seq_lens_decoder,
    const paddle::Tensor& step_idx, const paddle::Tensor& not_need_stop,
    const paddle::Tensor& pre_ids, const paddle::Tensor& accept_tokens,
    const paddle::Tensor& accept_num, const paddle::Tensor& target_model_seq_lens_encoder,
    const paddle::Tensor& target_model_seq_lens_decoder,
    const paddle::Tensor& target_model_step_idx, const paddle::Tensor& target_model_stop_flags,
    const paddle::Tensor& max_dec_len, const paddle::Tensor& target_model_draft_tokens,
    int num_model_step, bool is_splitwise_prefill) {
  fdmtp::paddle_binding::RunEntry([&] {
    fdmtp::DraftModelPreprocess(
        FDMTP_REF(draft_tokens), FDMTP_REF(input_ids), FDMTP_REF(stop_flags),
        FDMTP_REF(seq_lens_this_time), FDMTP_REF(seq_lens_encoder), FDMTP_REF(seq_lens_decoder),
        FDMTP_REF(step_idx), FDMTP_REF(not_need_stop), FDMTP_REF(pre_ids),
        FDMTP_REF(accept_tokens), FDMTP_REF(accept_num), FDMTP_REF(target_model_seq_lens_encoder),
        FDMTP_REF(target_model_seq_lens_decoder), FDMTP_REF(target_model_step_idx),
        FDMTP_REF(target_model_stop_flags), FDMTP_REF(max_dec_len),
        FDMTP_REF(target_model_draft_tokens), num_model_step, is_splitwise_prefill,
        fdmtp::paddle_binding::StreamOf(seq_lens_this_time));
  });
}

}  // namespace

PD_BUILD_OP(draft_model_preprocess)
    .Inputs({"draft_tokens", "input_ids", "stop_flags", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "step_idx", "not_need_stop", "pre_ids", "accept_tokens",
             "accept_num", "target_model_seq_lens_encoder", "target_model_seq_lens_decoder",
             "target_model_step_idx", "target_model_stop_flags", "max_dec_len",
             "target_model_draft_tokens"})
    .Outputs({"draft_tokens_out", "input_ids_out", "stop_flags_out", "seq_lens_this_time_out",
              "seq_lens_encoder_out", "seq_lens_decoder_out", "step_idx_out", "not_need_stop_out",
              "pre_ids_out", "target_model_draft_tokens_out"})
    .Attrs({"num_model_step: int", "is_splitwise_prefill: bool"})
    .SetInplaceMap({{"draft_tokens", "draft_tokens_out"},
                    {"input_ids", "input_ids_out"},
                    {"stop_flags", "stop_flags_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"step_idx", "step_idx_out"},
                    {"not_need_stop", "not_need_stop_out"},
                    {"pre_ids", "pre_ids_out"},
                    {"target_model_draft_tokens", "target_model_draft_tokens_out"}})
    .SetKernelFn(PD_KERNEL(DraftModelPreprocess));
