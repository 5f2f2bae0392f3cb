#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void MtpStepPaddle(const MtpStepArgs& args) { MtpStepRun(args); }

}  // namespace cpu
void Prepare(const ArgChecker& check, const MtpStepPaddleCall& call, MtpStepArgs* args) {
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = check.ItemCount(slt);
  check.PerItem(
      {&call.base_model_stop_flags, &call.stop_flags, &call.batch_drop, &call.seq_lens_encoder,
       &call.seq_lens_decoder, &call.encoder_block_lens, &call.used_list_len},
      bsz, slt);
  check.Rows(call.block_tables, bsz, slt);
  check.Rank(call.free_list, 1);
  check.Numel(call.free_list_len, 1);
  check.AttrAtLeast("block_size", call.block_size, 1);
  check.AttrAtLeast("max_draft_tokens", call.max_draft_tokens, 0);
  // Values (lengths, counts, free_list_len) are not checked on the host on any backend:
  // the shared allocator clamps them the same way on CPU, CUDA and XPU.
  args->bsz = bsz;
  args->max_blocks = call.block_tables.dim(1);
  args->free_capacity = call.free_list.dim(0);
}

}  // namespace fdmtp
