#include "fdmtp/ops.h"
#include "row_gather.h"

namespace fdmtp {

void EagleGatherHiddenStates(const TensorRef& input, const TensorRef& cu_seqlens_q,
                             const TensorRef& seq_lens_this_time,
                             const TensorRef& seq_lens_decoder, const TensorRef& seq_lens_encoder,
                             const TensorRef& batch_id_per_token_output,
                             const TensorRef& cu_seqlens_q_output,
                             const TensorRef& real_output_token_num, const TensorRef& out,
                             const TensorRef& output_token_num, void* stream) {
  const ArgChecker check("eagle_gather_hidden_states");
  // Only input and seq_lens_this_time are read; the others are legacy inputs (as upstream).
  check.SameDevice({&input, &cu_seqlens_q, &seq_lens_this_time, &seq_lens_decoder,
                    &seq_lens_encoder, &batch_id_per_token_output, &cu_seqlens_q_output,
                    &real_output_token_num, &out, &output_token_num});
  const int64_t bsz = BatchSize(check, seq_lens_this_time);
  CheckPerItemInt32(check, seq_lens_this_time, bsz, seq_lens_this_time);
  EagleGatherHiddenStatesArgs args;
  args.rows = CheckRowGather(check, input, out, output_token_num, bsz, bsz,
                             "`seq_lens_this_time`.shape[0]");
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  FDMTP_DISPATCH_ROW_GATHER(check, input, args, stream, EagleGatherHiddenStates,
                            eagle_gather_hidden_states);
}

}  // namespace fdmtp
