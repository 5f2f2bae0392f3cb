#include <algorithm>
#include <string>
#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void VerifyDraftTokens(const VerifyDraftTokensArgs& args) {
  for (int64_t b = 0; b < args.max_bsz; ++b) VerifyDraftTokensItem(args, b);
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const VerifyDraftTokensCall& call,
             VerifyDraftTokensArgs* args) {
  // max_seq_len (upstream passes max_model_len) and verify_window (the old top-2 window
  // fallback, gone upstream too) are accepted and never used.
  if (call.verify_strategy < 0 || call.verify_strategy >= kNumVerifyStrategies) {
    check.Fail(
        "`verify_strategy` must be 0 (TOPP), 1 (GREEDY), 2 (TARGET_MATCH) or 3 "
        "(REJECTION), got " +
        std::to_string(call.verify_strategy));
  }
  // Slots: max_bsz from step_output_ids (as upstream); items: real_bsz from
  // seq_lens_this_time. Both rows of drafts/outputs have the same width K + 1 (which may be
  // 0: such rows are never indexed); step_input_ids may have more rows (not read).
  check.Rank(call.step_output_ids, 2);
  check.Rows(call.step_input_ids, call.step_output_ids.dim(0), call.step_output_ids);
  check.DimEq(call.step_input_ids, 1, call.step_output_ids, 1);
  const int64_t max_bsz = call.step_output_ids.dim(0);
  check.PerItem({&call.step_output_len, &call.topp, &call.stop_flags, &call.seq_lens_encoder,
                 &call.is_block_step, &call.reasoning_status, &call.max_dec_len, &call.step_idx},
                max_bsz, call.step_output_ids);
  const int64_t real_bsz = check.ItemCount(call.seq_lens_this_time);
  if (real_bsz > max_bsz) {
    check.Fail("`seq_lens_this_time` has " + std::to_string(real_bsz) +
               " items but `step_output_ids` has only " + std::to_string(max_bsz) + " slots");
  }
  if (check.ItemCount(call.cu_seqlens_q_output) < real_bsz) {
    check.Fail("`cu_seqlens_q_output` must have at least " + std::to_string(real_bsz) +
               " entries (one per item of `seq_lens_this_time`), got shape " +
               call.cu_seqlens_q_output.ShapeString());
  }
  const int64_t num_end_tokens = check.ItemCount(call.end_tokens);
  if (num_end_tokens < 1) check.Fail("`end_tokens` must hold at least one EOS id, got none");

  // Optional row tensors: shapes whenever given, presence per strategy.
  int64_t candidate_rows = 0;
  int64_t num_candidates = 1;
  if (call.candidate_ids) {
    check.Rank(*call.candidate_ids, 2);
    candidate_rows = call.candidate_ids->dim(0);
    num_candidates = call.candidate_ids->dim(1);
    if (num_candidates < 1) check.Fail("`candidate_ids` must have at least one column");
  }
  if (call.candidate_scores) {
    check.Rank(*call.candidate_scores, 2);
    if (call.candidate_ids) {
      check.DimEq(*call.candidate_scores, 0, *call.candidate_ids, 0);
      check.DimEq(*call.candidate_scores, 1, *call.candidate_ids, 1);
    }
  }
  if (call.candidate_lens) {
    const int64_t rows = check.ItemCount(*call.candidate_lens);
    if (call.candidate_ids && rows != candidate_rows)
      check.DimEq(*call.candidate_lens, 0, *call.candidate_ids, 0);
  }
  const int64_t target_rows = call.target_tokens ? check.ItemCount(*call.target_tokens) : 0;
  int64_t uniform_rows = 0;
  if (call.verify_uniforms) {
    check.Rank(*call.verify_uniforms, 2);
    if (call.verify_uniforms->dim(1) != 2) {
      check.Fail("`verify_uniforms` must have shape [rows, 2] (u_acc, u_draw), got " +
                 call.verify_uniforms->ShapeString());
    }
    uniform_rows = call.verify_uniforms->dim(0);
  }
  int64_t num_rows = 0;
  if (call.verify_strategy == kVerifyGreedy || call.verify_strategy == kVerifyTargetMatch) {
    const std::string why = call.verify_strategy == kVerifyGreedy
                                ? "verify_strategy = GREEDY (1)"
                                : "verify_strategy = TARGET_MATCH (2)";
    check.Required(call.target_tokens, "target_tokens", why);
    num_rows = target_rows;
  } else {
    const std::string why = call.verify_strategy == kVerifyTopP ? "verify_strategy = TOPP (0)"
                                                                : "verify_strategy = REJECTION (3)";
    check.Required(call.candidate_ids, "candidate_ids", why);
    check.Required(call.candidate_scores, "candidate_scores", why);
    check.Required(call.candidate_lens, "candidate_lens", why);
    // REJECTION needs the caller's uniforms (its losslessness rests on fresh ones per
    // position); TOPP without them draws from the built-in counter-based generator
    // (verify_detail::TopPUniform), as upstream's TOPP draws from its own state.
    if (call.verify_strategy == kVerifyRejection) {
      check.Required(call.verify_uniforms, "verify_uniforms", why);
    }
    num_rows = call.verify_uniforms ? std::min(candidate_rows, uniform_rows) : candidate_rows;
  }
  // No value checks: seq_lens_this_time, cu_seqlens_q_output, candidate_lens, step_idx and
  // max_dec_len are clamped or bounds-checked by the shared per-item logic on every backend.
  args->max_bsz = max_bsz;
  args->real_bsz = real_bsz;
  args->width = call.step_output_ids.dim(1);
  args->num_candidates = num_candidates;
  args->num_rows = num_rows;
  args->num_end_tokens = num_end_tokens;
}

}  // namespace fdmtp
