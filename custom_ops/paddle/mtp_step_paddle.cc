// Paddle binding of mtp_step_paddle: FastDeploy's 11 inputs, attrs and 5 in-place outputs,
// plus the four tensors upstream writes without declaring them (batch_drop,
// seq_lens_this_time, seq_lens_decoder, encoder_block_lens; DESIGN.md §2 deviation 4).
#include "tensor_ref.h"

namespace {

void MtpStepPaddle(const paddle::Tensor& base_model_stop_flags, const paddle::Tensor& stop_flags,
                   const paddle::Tensor& batch_drop, const paddle::Tensor& seq_lens_this_time,
                   const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& seq_lens_decoder,
                   const paddle::Tensor& block_tables, const paddle::Tensor& encoder_block_lens,
                   const paddle::Tensor& used_list_len, const paddle::Tensor& free_list,
                   const paddle::Tensor& free_list_len, int block_size, int max_draft_tokens) {
  fdmtp::paddle_binding::RunEntry([&] {
    fdmtp::MtpStepPaddle(FDMTP_REF(base_model_stop_flags), FDMTP_REF(stop_flags),
                         FDMTP_REF(batch_drop), FDMTP_REF(seq_lens_this_time),
                         FDMTP_REF(seq_lens_encoder), FDMTP_REF(seq_lens_decoder),
                         FDMTP_REF(block_tables), FDMTP_REF(encoder_block_lens),
                         FDMTP_REF(used_list_len), FDMTP_REF(free_list), FDMTP_REF(free_list_len),
                         block_size, max_draft_tokens,
                         fdmtp::paddle_binding::StreamOf(seq_lens_this_time));
  });
}

}  // namespace

PD_BUILD_OP(mtp_step_paddle)
    .Inputs({"base_model_stop_flags", "stop_flags", "batch_drop", "seq_lens_this_time",
             "seq_lens_encoder", "seq_lens_decoder", "block_tables", "encoder_block_lens",
             "used_list_len", "free_list", "free_list_len"})
    .Attrs({"block_size: int", "max_draft_tokens: int"})
    .Outputs({"block_tables_out", "stop_flags_out", "used_list_len_out", "free_list_out",
              "free_list_len_out", "batch_drop_out", "seq_lens_this_time_out",
              "seq_lens_decoder_out", "encoder_block_lens_out"})
    .SetInplaceMap({{"block_tables", "block_tables_out"},
                    {"stop_flags", "stop_flags_out"},
                    {"used_list_len", "used_list_len_out"},
                    {"free_list", "free_list_out"},
                    {"free_list_len", "free_list_len_out"},
                    {"batch_drop", "batch_drop_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"encoder_block_lens", "encoder_block_lens_out"}})
    .SetKernelFn(PD_KERNEL(MtpStepPaddle));
