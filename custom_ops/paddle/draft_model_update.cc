// Paddle binding of draft_model_update: FastDeploy's 13 inputs, 9 in-place outputs, attrs.
#include "tensor_ref.h"

namespace {

void DraftModelUpdate(const paddle::Tensor& inter_next_tokens, const paddle::Tensor& draft_tokens,
                      const paddle::Tensor& pre_ids, const paddle::Tensor& seq_lens_this_time,
                      const paddle::Tensor& seq_lens_encoder,
                      const paddle::Tensor& seq_lens_decoder, const paddle::Tensor& step_idx,
                      const paddle::Tensor& cu_seqlens_q_output, const paddle::Tensor& stop_flags,
                      const paddle::Tensor& not_need_stop, const paddle::Tensor& max_dec_len,
                      const paddle::Tensor& end_ids,
                      const paddle::Tensor& base_model_draft_tokens, int max_seq_len,
                      int substep) {
  fdmtp::paddle_binding::RunEntry([&] {
    fdmtp::DraftModelUpdate(
        FDMTP_REF(inter_next_tokens), FDMTP_REF(draft_tokens), FDMTP_REF(pre_ids),
        FDMTP_REF(seq_lens_this_time), FDMTP_REF(seq_lens_encoder), FDMTP_REF(seq_lens_decoder),
        FDMTP_REF(step_idx), FDMTP_REF(cu_seqlens_q_output), FDMTP_REF(stop_flags),
        FDMTP_REF(not_need_stop), FDMTP_REF(max_dec_len), FDMTP_REF(end_ids),
        FDMTP_REF(base_model_draft_tokens), max_seq_len, substep,
        fdmtp::paddle_binding::StreamOf(seq_lens_this_time));
  });
}

}  // namespace

PD_BUILD_OP(draft_model_update)
    .Inputs({"inter_next_tokens", "draft_tokens", "pre_ids", "seq_lens_this_time",
             "seq_lens_encoder", "seq_lens_decoder", "step_idx", "cu_seqlens_q_output",
             "stop_flags", "not_need_stop", "max_dec_len", "end_ids", "base_model_draft_tokens"})
    .Attrs({"max_seq_len: int", "substep: int"})
    .Outputs({"draft_tokens_out", "pre_ids_out", "seq_lens_this_time_out", "seq_lens_encoder_out",
              "seq_lens_decoder_out", "step_idx_out", "stop_flags_out", "not_need_stop_out",
              "base_model_draft_tokens_out"})
    .SetInplaceMap({{"draft_tokens", "draft_tokens_out"},
                    {"pre_ids", "pre_ids_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"step_idx", "step_idx_out"},
                    {"stop_flags", "stop_flags_out"},
                    {"not_need_stop", "not_need_stop_out"},
                    {"base_model_draft_tokens", "base_model_draft_tokens_out"}})
    .SetKernelFn(PD_KERNEL(DraftModelUpdate));
