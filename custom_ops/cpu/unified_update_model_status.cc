#include <string>
#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args) {
  bool any_running = false;
  for (int64_t b = 0; b < args.max_bsz; ++b) {
    any_running = UnifiedUpdateModelStatusItem(args, b) || any_running;
  }
  args.has_running_seqs[0] = any_running;
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const UnifiedUpdateModelStatusCall& call,
             UnifiedUpdateModelStatusArgs* args) {
  // Slots: max_bsz from stop_flags (as upstream); items: real_bsz from seq_lens_this_time.
  const int64_t max_bsz = check.ItemCount(call.stop_flags);
  check.PerItem({&call.seq_lens_encoder, &call.seq_lens_decoder, &call.step_output_len,
                 &call.is_paused, &call.prompt_lens, &call.step_idx, &call.max_dec_len},
                max_bsz, call.stop_flags);
  // Row matrices: at least max_bsz rows (rows past it are not read), each read with its
  // own row stride; the output rows are as wide as the input rows.
  check.Rows(call.step_input_ids, max_bsz, call.stop_flags);
  check.Rows(call.step_output_ids, max_bsz, call.stop_flags);
  check.Rows(call.token_ids_all, max_bsz, call.stop_flags);
  check.DimEq(call.step_output_ids, 1, call.step_input_ids, 1);
  const int64_t real_bsz = check.ItemCount(call.seq_lens_this_time);
  if (real_bsz > max_bsz) {
    check.Fail("`seq_lens_this_time` has " + std::to_string(real_bsz) +
               " items but `stop_flags` has only " + std::to_string(max_bsz) + " slots");
  }
  if (call.has_running_seqs.numel() != 1) {
    check.Fail("`has_running_seqs` must hold exactly one element, got shape " +
               call.has_running_seqs.ShapeString());
  }
  const int64_t num_end_tokens = check.ItemCount(call.end_tokens);
  if (num_end_tokens < 1) check.Fail("`end_tokens` must hold at least one EOS id, got none");
  const int64_t width = call.step_output_ids.dim(1);
  // No value checks: step_output_len, prompt_lens and step_idx are clamped by the shared
  // per-item logic on every backend (see fdmtp/unified_update_model_status.h).
  args->max_bsz = max_bsz;
  args->real_bsz = real_bsz;
  args->width = width;
  args->max_model_len = call.token_ids_all.dim(1);
  args->num_end_tokens = num_end_tokens;
}

}  // namespace fdmtp
