// Paddle binding of unified_update_model_status: FastDeploy's 14 inputs, 10 in-place
// outputs, no attrs.
#include "tensor_ref.h"

namespace {

void UnifiedUpdateModelStatus(const paddle::Tensor& seq_lens_encoder,
                              const paddle::Tensor& seq_lens_decoder,
                              const paddle::Tensor& has_running_seqs,
                              const paddle::Tensor& step_input_ids,
                              const paddle::Tensor& step_output_ids,
                              const paddle::Tensor& step_output_len,
                              const paddle::Tensor& stop_flags,
                              const paddle::Tensor& seq_lens_this_time,
                              const paddle::Tensor& is_paused, const paddle::Tensor& token_ids_all,
                              const paddle::Tensor& prompt_lens, const paddle::Tensor& step_idx,
                              const paddle::Tensor& end_tokens, const paddle::Tensor& max_dec_len) {
  namespace pb = fdmtp::paddle_binding;
  pb::RunEntry([&] {
    fdmtp::UnifiedUpdateModelStatus(
        FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(seq_lens_decoder),
        FDMTP_REF(has_running_seqs), FDMTP_REF(step_input_ids),
        FDMTP_REF(step_output_ids), FDMTP_REF(step_output_len),
        FDMTP_REF(stop_flags), FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(is_paused), FDMTP_REF(token_ids_all),
        FDMTP_REF(prompt_lens), FDMTP_REF(step_idx),
        FDMTP_REF(end_tokens), FDMTP_REF(max_dec_len),
        pb::StreamOf(stop_flags));
  });
}

}  // namespace

PD_BUILD_OP(unified_update_model_status)
    .Inputs({"seq_lens_encoder", "seq_lens_decoder", "has_running_seqs", "step_input_ids",
             "step_output_ids", "step_output_len", "stop_flags", "seq_lens_this_time", "is_paused",
             "token_ids_all", "prompt_lens", "step_idx", "end_tokens", "max_dec_len"})
    .Outputs({"seq_lens_encoder_out", "seq_lens_decoder_out", "has_running_seqs_out",
              "step_input_ids_out", "step_output_ids_out", "step_output_len_out", "stop_flags_out",
              "seq_lens_this_time_out", "token_ids_all_out", "step_idx_out"})
    .SetInplaceMap({{"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"has_running_seqs", "has_running_seqs_out"},
                    {"step_input_ids", "step_input_ids_out"},
                    {"step_output_ids", "step_output_ids_out"},
                    {"step_output_len", "step_output_len_out"},
                    {"stop_flags", "stop_flags_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"token_ids_all", "token_ids_all_out"},
                    {"step_idx", "step_idx_out"}})
    .SetKernelFn(PD_KERNEL(UnifiedUpdateModelStatus));
