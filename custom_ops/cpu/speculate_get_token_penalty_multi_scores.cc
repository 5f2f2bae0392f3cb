#include <string>
#include "fdmtp/ops.h"

#include "entry/checks.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void SpeculateGetTokenPenaltyMultiScores(const SpeculateGetTokenPenaltyMultiScoresArgs& args) {
  for (int64_t r = 0; r < args.rows; ++r) SpeculateGetTokenPenaltyMultiScoresRow<T>(args, r);
}

#define FDMTP_INSTANTIATE(T)                            \
  template void SpeculateGetTokenPenaltyMultiScores<T>( \
      const SpeculateGetTokenPenaltyMultiScoresArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
void Prepare(const ArgChecker& check, const SpeculateGetTokenPenaltyMultiScoresCall& call,
             SpeculateGetTokenPenaltyMultiScoresArgs* args) {
  // max_seq_len (upstream passes max_model_len) is accepted and never used. The batch size N
  // comes from seq_lens_this_time (as upstream); every per-item tensor and row matrix may
  // have more rows (not read).
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = check.ItemCount(slt);
  check.PerItem(
      {&call.prompt_lens, &call.penalty_scores, &call.frequency_scores, &call.presence_scores,
       &call.temperatures, &call.bad_tokens_len, &call.cur_len, &call.min_len},
      bsz, slt);
  check.Rows(call.token_ids_all, bsz, slt);
  check.Rows(call.bad_tokens, bsz, slt);
  check.Rank(call.logits, 2);
  const int64_t rows = call.logits.dim(0);
  if (check.ItemCount(call.batch_id_per_token_output) < rows) {
    check.Fail("`batch_id_per_token_output` must have at least " + std::to_string(rows) +
               " entries (one per row of `logits`), got shape " +
               call.batch_id_per_token_output.ShapeString());
  }
  if (check.ItemCount(call.cu_seqlens_q_output) < bsz) {
    check.Fail("`cu_seqlens_q_output` must have at least " + std::to_string(bsz) +
               " entries (one per item of `seq_lens_this_time`), got shape " +
               call.cu_seqlens_q_output.ShapeString());
  }
  args->num_eos = check.ItemCount(call.eos_token_id);
  args->draft_width = 0;
  if (call.step_input_ids) {
    check.Rows(*call.step_input_ids, bsz, slt);
    args->draft_width = call.step_input_ids->dim(1);
  }
  // No value checks: ids, lengths, offsets and batch ids are clamped or bounds-checked by
  // the shared per-row logic on every backend.
  args->bsz = bsz;
  args->rows = rows;
  args->vocab = call.logits.dim(1);
  args->hist_width = call.token_ids_all.dim(1);
  args->bad_width = call.bad_tokens.dim(1);
  switch (call.logits.dtype) {
    case DType::kFloat16: args->float_kind = kPenaltyFloat16; break;
    case DType::kBFloat16: args->float_kind = kPenaltyBFloat16; break;
    default: args->float_kind = kPenaltyFloat32; break;
  }
}

}  // namespace fdmtp
