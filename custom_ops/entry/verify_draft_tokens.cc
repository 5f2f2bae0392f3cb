#include <algorithm>
#include <limits>
#include <string>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void VerifyDraftTokens(const TensorRef& step_output_ids, const TensorRef& step_output_len,
                       const TensorRef& step_input_ids, const OptionalTensorRef& target_tokens,
                       const OptionalTensorRef& candidate_ids,
                       const OptionalTensorRef& candidate_scores,
                       const OptionalTensorRef& candidate_lens, const TensorRef& topp,
                       const TensorRef& stop_flags, const TensorRef& seq_lens_encoder,
                       const TensorRef& seq_lens_this_time, const TensorRef& end_tokens,
                       const TensorRef& is_block_step, const TensorRef& cu_seqlens_q_output,
                       const TensorRef& reasoning_status, const TensorRef& max_dec_len,
                       const TensorRef& step_idx, const OptionalTensorRef& verify_uniforms,
                       int max_seq_len, int verify_window, int verify_strategy, bool reject_all,
                       bool accept_all, void* stream) {
  (void)max_seq_len;    // upstream passes max_model_len; the kernel never used it
  (void)verify_window;  // the old top-2 window fallback is gone upstream too
  const ArgChecker check("verify_draft_tokens");
  if (verify_strategy < 0 || verify_strategy >= kNumVerifyStrategies) {
    check.Fail("`verify_strategy` must be 0 (TOPP), 1 (GREEDY), 2 (TARGET_MATCH) or 3 "
               "(REJECTION), got " + std::to_string(verify_strategy));
  }
  const std::vector<const TensorRef*> required = {
      &step_output_ids, &step_output_len, &step_input_ids,   &topp,
      &stop_flags,      &seq_lens_encoder, &seq_lens_this_time, &end_tokens,
      &is_block_step,   &cu_seqlens_q_output, &reasoning_status, &max_dec_len,
      &step_idx};
  std::vector<const TensorRef*> all = required;
  for (const TensorRef* t :
       Present({&target_tokens, &candidate_ids, &candidate_scores, &candidate_lens, &verify_uniforms})) {
    all.push_back(t);
  }
  check.SameDevice(all);
  check.Dtype(step_output_ids, DType::kInt64);
  check.Dtype(step_output_len, DType::kInt32);
  check.Dtype(step_input_ids, DType::kInt64);
  check.Dtype(topp, DType::kFloat32);
  check.Dtype(stop_flags, DType::kBool);
  check.Dtype(seq_lens_encoder, DType::kInt32);
  check.Dtype(seq_lens_this_time, DType::kInt32);
  check.Dtype(end_tokens, DType::kInt64);
  check.Dtype(is_block_step, DType::kBool);
  check.Dtype(cu_seqlens_q_output, DType::kInt32);
  check.Dtype(reasoning_status, DType::kInt32);
  check.Dtype(max_dec_len, DType::kInt64);
  check.Dtype(step_idx, DType::kInt64);
  if (target_tokens) check.Dtype(*target_tokens, DType::kInt64);
  if (candidate_ids) check.Dtype(*candidate_ids, DType::kInt64);
  if (candidate_scores) check.Dtype(*candidate_scores, DType::kFloat32);
  if (candidate_lens) check.Dtype(*candidate_lens, DType::kInt32);
  if (verify_uniforms) check.Dtype(*verify_uniforms, DType::kFloat32);

  // Slots: max_bsz from step_output_ids (as upstream); items: real_bsz from
  // seq_lens_this_time. Both rows of drafts/outputs have the same width K + 1.
  check.Rank(step_output_ids, 2);
  check.Rank(step_input_ids, 2);
  check.DimEq(step_input_ids, 0, step_output_ids, 0);
  check.DimEq(step_input_ids, 1, step_output_ids, 1);
  const int64_t max_bsz = step_output_ids.dim(0);
  for (const TensorRef* t : {&step_output_len, &topp, &stop_flags, &seq_lens_encoder,
                             &is_block_step, &reasoning_status, &max_dec_len, &step_idx}) {
    check.PerItem(*t, max_bsz, step_output_ids);
  }
  const int64_t real_bsz = check.ItemCount(seq_lens_this_time);
  if (real_bsz > max_bsz) {
    check.Fail("`seq_lens_this_time` has " + std::to_string(real_bsz) +
               " items but `step_output_ids` has only " + std::to_string(max_bsz) + " slots");
  }
  if (check.ItemCount(cu_seqlens_q_output) < real_bsz) {
    check.Fail("`cu_seqlens_q_output` must have at least " + std::to_string(real_bsz) +
               " entries (one per item of `seq_lens_this_time`), got shape " +
               cu_seqlens_q_output.ShapeString());
  }
  const int64_t num_end_tokens = check.ItemCount(end_tokens);
  if (num_end_tokens < 1) check.Fail("`end_tokens` must hold at least one EOS id, got none");

  // Optional row tensors: shapes whenever given, presence per strategy.
  int64_t candidate_rows = 0;
  int64_t num_candidates = 1;
  if (candidate_ids) {
    check.Rank(*candidate_ids, 2);
    candidate_rows = candidate_ids->dim(0);
    num_candidates = candidate_ids->dim(1);
    if (num_candidates < 1) check.Fail("`candidate_ids` must have at least one column");
  }
  if (candidate_scores) {
    check.Rank(*candidate_scores, 2);
    if (candidate_ids) {
      check.DimEq(*candidate_scores, 0, *candidate_ids, 0);
      check.DimEq(*candidate_scores, 1, *candidate_ids, 1);
    }
  }
  if (candidate_lens) {
    const int64_t rows = check.ItemCount(*candidate_lens);
    if (candidate_ids && rows != candidate_rows) check.DimEq(*candidate_lens, 0, *candidate_ids, 0);
  }
  const int64_t target_rows = target_tokens ? check.ItemCount(*target_tokens) : 0;
  int64_t uniform_rows = 0;
  if (verify_uniforms) {
    check.Rank(*verify_uniforms, 2);
    if (verify_uniforms->dim(1) != 2) {
      check.Fail("`verify_uniforms` must have shape [rows, 2] (u_acc, u_draw), got " +
                 verify_uniforms->ShapeString());
    }
    uniform_rows = verify_uniforms->dim(0);
  }
  int64_t num_rows = 0;
  if (verify_strategy == kVerifyGreedy || verify_strategy == kVerifyTargetMatch) {
    const std::string why = verify_strategy == kVerifyGreedy ? "verify_strategy = GREEDY (1)"
                                                             : "verify_strategy = TARGET_MATCH (2)";
    check.Required(target_tokens, "target_tokens", why);
    num_rows = target_rows;
  } else {
    const std::string why = verify_strategy == kVerifyTopP ? "verify_strategy = TOPP (0)"
                                                           : "verify_strategy = REJECTION (3)";
    check.Required(candidate_ids, "candidate_ids", why);
    check.Required(candidate_scores, "candidate_scores", why);
    check.Required(candidate_lens, "candidate_lens", why);
    check.Required(verify_uniforms, "verify_uniforms", why);
    num_rows = std::min(candidate_rows, uniform_rows);
  }
  for (const TensorRef* t : all) check.Contiguous(*t);
  // Value checks that need no device sync (host tensors only; the kernel treats a
  // negative count as 0 on the device).
  check.ValuesInRangeOnHost(seq_lens_this_time, 0, std::numeric_limits<int32_t>::max());

  VerifyDraftTokensArgs args;
  args.step_output_ids = step_output_ids.ptr<int64_t>();
  args.step_output_len = step_output_len.ptr<int32_t>();
  args.step_input_ids = step_input_ids.ptr<const int64_t>();
  args.target_tokens = DataOrNull<const int64_t>(target_tokens);
  args.candidate_ids = DataOrNull<const int64_t>(candidate_ids);
  args.candidate_scores = DataOrNull<const float>(candidate_scores);
  args.candidate_lens = DataOrNull<const int32_t>(candidate_lens);
  args.topp = topp.ptr<const float>();
  args.stop_flags = stop_flags.ptr<const bool>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  args.end_tokens = end_tokens.ptr<const int64_t>();
  args.is_block_step = is_block_step.ptr<const bool>();
  args.cu_seqlens_q_output = cu_seqlens_q_output.ptr<const int32_t>();
  args.reasoning_status = reasoning_status.ptr<const int32_t>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.step_idx = step_idx.ptr<const int64_t>();
  args.verify_uniforms = DataOrNull<const float>(verify_uniforms);
  args.max_bsz = max_bsz;
  args.real_bsz = real_bsz;
  args.width = step_output_ids.dim(1);
  args.num_candidates = num_candidates;
  args.num_rows = num_rows;
  args.num_end_tokens = num_end_tokens;
  args.strategy = verify_strategy;
  args.reject_all = reject_all;
  args.accept_all = accept_all;
  Dispatch(
      check, step_output_ids.device, [&] { cpu::VerifyDraftTokens(args); },
      [&] { return cuda::VerifyDraftTokens(args, stream); },
      [&](xpu::Context* ctx) { return xpu::verify_draft_tokens(ctx, args); });
}

}  // namespace fdmtp
