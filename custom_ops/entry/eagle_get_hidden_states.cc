#include "fdmtp/ops.h"
#include "row_gather.h"

namespace fdmtp {

void EagleGetHiddenStates(const TensorRef& input, const TensorRef& seq_lens_this_time,
                          const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                          const TensorRef& stop_flags, const TensorRef& accept_nums,
                          const TensorRef& base_model_seq_lens_this_time,
                          const TensorRef& base_model_seq_lens_encoder,
                          int64_t actual_draft_token_num, const TensorRef& out,
                          const TensorRef& output_token_num, void* stream) {
  (void)actual_draft_token_num;  // unused by the develop GPU semantics (kept for the signature)
  const ArgChecker check("eagle_get_hidden_states");
  // seq_lens_decoder, stop_flags and base_model_seq_lens_encoder are not read (as upstream).
  check.SameDevice({&input, &seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder, &stop_flags,
                    &accept_nums, &base_model_seq_lens_this_time, &base_model_seq_lens_encoder,
                    &out, &output_token_num});
  const int64_t bsz = BatchSize(check, seq_lens_this_time);
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &accept_nums,
                             &base_model_seq_lens_this_time}) {
    CheckPerItemInt32(check, *t, bsz, seq_lens_this_time);
  }
  const int64_t rows = input.shape.size() == 2 ? input.dim(0) : 0;
  EagleGetHiddenStatesArgs args;
  args.rows = CheckRowGather(check, input, out, output_token_num, rows, bsz, "`input`.shape[0]");
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.accept_nums = accept_nums.ptr<const int32_t>();
  args.base_model_seq_lens_this_time = base_model_seq_lens_this_time.ptr<const int32_t>();
  FDMTP_DISPATCH_ROW_GATHER(check, input, args, stream, EagleGetHiddenStates,
                            eagle_get_hidden_states);
}

}  // namespace fdmtp
