#include <limits>
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
  for (const TensorRef* t : {&call.seq_lens_encoder, &call.seq_lens_decoder, &call.step_idx,
                             &call.stop_flags, &call.max_dec_len}) {
    check.PerItem(*t, bsz, slt);
  }
  for (const TensorRef* t : {&call.draft_tokens, &call.pre_ids, &call.base_model_draft_tokens}) {
    check.Rows(*t, bsz, slt);
  }
  check.DimEq(call.base_model_draft_tokens, 1, call.draft_tokens, 1);
  if (call.draft_tokens.dim(1) < 1) check.Fail("`draft_tokens` must have at least one column");
  // cu_seqlens_q_output and end_ids are accepted for FastDeploy compatibility and unused
  // (develop's kernel reads neither); their shapes are still checked.
  if (call.cu_seqlens_q_output.numel() < bsz + 1) {
    check.Fail("`cu_seqlens_q_output` must have at least bsz + 1 = " + std::to_string(bsz + 1) +
               " elements, got shape " + call.cu_seqlens_q_output.ShapeString());
  }
  check.Numel(call.not_need_stop, 1);
  check.AttrAtLeast("max_seq_len", call.max_seq_len, 0);
  check.AttrAtLeast("substep", call.substep, 0);
  if (call.substep + 1 >= call.base_model_draft_tokens.dim(1)) {
    check.Fail("attr `substep` = " + std::to_string(call.substep) +
               " writes slot substep + 1 of `base_model_draft_tokens`, which has only " +
               std::to_string(call.base_model_draft_tokens.dim(1)) + " columns (K + 1)");
  }
  // Host tensors are value-checked (device tensors are not read back: no sync).
  for (const TensorRef* t : {&slt, &call.seq_lens_encoder, &call.seq_lens_decoder}) {
    check.ValuesInRangeOnHost(*t, 0, std::numeric_limits<int32_t>::max());
  }
  args->bsz = bsz;
  args->num_tokens = call.inter_next_tokens.numel();
  args->draft_width = call.draft_tokens.dim(1);
  args->base_width = call.base_model_draft_tokens.dim(1);
  args->pre_ids_len = call.pre_ids.dim(1);
}

}  // namespace fdmtp
