#include "fdmtp/ops.h"
#include "row_gather.h"

namespace fdmtp {

void EagleGetSelfHiddenStates(const TensorRef& input, const TensorRef& last_seq_lens_this_time,
                              const TensorRef& seq_lens_this_time,
                              const TensorRef& seq_lens_encoder, const TensorRef& out,
                              const TensorRef& output_token_num, void* stream) {
  const ArgChecker check("eagle_get_self_hidden_states");
  check.SameDevice({&input, &last_seq_lens_this_time, &seq_lens_this_time, &seq_lens_encoder, &out,
                    &output_token_num});
  const int64_t bsz = BatchSize(check, seq_lens_this_time);
  for (const TensorRef* t : {&last_seq_lens_this_time, &seq_lens_this_time, &seq_lens_encoder}) {
    CheckPerItemInt32(check, *t, bsz, seq_lens_this_time);
  }
  const int64_t rows = input.shape.size() == 2 ? input.dim(0) : 0;
  EagleGetSelfHiddenStatesArgs args;
  args.rows = CheckRowGather(check, input, out, output_token_num, rows, bsz, "`input`.shape[0]");
  args.last_seq_lens_this_time = last_seq_lens_this_time.ptr<const int32_t>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  FDMTP_DISPATCH_ROW_GATHER(check, input, args, stream, EagleGetSelfHiddenStates,
                            eagle_get_self_hidden_states);
}

}  // namespace fdmtp
