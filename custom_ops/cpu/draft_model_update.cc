#include <string>
#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void DraftModelUpdate(const DraftModelUpdateArgs& args) {
  int64_t k = 0;  // compacted index: counted from the input seq_lens_this_time
  bool any_running = false;
  for (int64_t b = 0; b < args.bsz; ++b) {
    const bool active = args.seq_lens_this_time[b] > 0;  // read before the item is updated
    any_running = !DraftModelUpdateItem(args, b, k) || any_running;
    k += active ? 1 : 0;
  }
  *args.not_need_stop = any_running;
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const DraftModelUpdateCall& call,
             DraftModelUpdateArgs* args) {
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = check.ItemCount(slt);
  check.PerItem({&call.seq_lens_encoder, &call.seq_lens_decoder, &call.step_idx, &call.stop_flags,
                 &call.max_dec_len},
                bsz, slt);
  check.Rows({&call.draft_tokens, &call.pre_ids, &call.base_model_draft_tokens}, bsz, slt);
  // Each row tensor is read with its own width (upstream's tests pass draft_tokens [N, 4]
  // with base_model_draft_tokens [N, 5]); a row without column 0 is not written.
  // cu_seqlens_q_output and end_ids are accepted for FastDeploy compatibility and never
  // read (develop's kernel reads neither): any shape ([N + 1], [N], ...).
  check.Numel(call.not_need_stop, 1);
  check.AttrAtLeast("max_seq_len", call.max_seq_len, 0);
  check.AttrAtLeast("substep", call.substep, 0);
  const int64_t base_width = call.base_model_draft_tokens.dim(1);
  if (static_cast<int64_t>(call.substep) >= base_width - 1) {  // 64-bit: cannot overflow
    check.Fail("attr `substep` = " + std::to_string(call.substep) +
               " writes slot substep + 1 of `base_model_draft_tokens`, which has only " +
               std::to_string(base_width) + " columns (K + 1)");
  }
  // Lengths, steps and limits are values (not checked on the host on any backend): the
  // shared per-item logic clamps them the same way on CPU, CUDA and XPU.
  args->bsz = bsz;
  args->num_tokens = call.inter_next_tokens.numel();
  args->draft_width = call.draft_tokens.dim(1);
  args->base_width = call.base_model_draft_tokens.dim(1);
  args->pre_ids_len = call.pre_ids.dim(1);
}

}  // namespace fdmtp
