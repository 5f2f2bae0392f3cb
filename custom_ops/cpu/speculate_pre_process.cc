#include <algorithm>
#include <string>

#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void SpeculatePreProcess(const SpeculatePreProcessArgs& args) {
  for (int64_t t = 0; t < args.token_num; ++t) {
    args.ids_remove_padding[t] = kPaddingTokenFill;
    args.batch_id_per_token[t] = kNoBatchId;
  }
  for (int64_t r = 0; r < args.output_capacity; ++r) args.batch_id_per_token_output[r] = kNoBatchId;
  int64_t in_total = 0;
  int64_t out_total = 0;
  args.cu_seqlens_q[0] = 0;
  args.cu_seqlens_k[0] = 0;
  args.cu_seq_lens_q_output[0] = 0;
  for (int64_t b = 0; b < args.bsz; ++b) {
    in_total = SpeculateOffsetAdd(in_total, SpeculateInputTokens(args, b));
    out_total = SpeculateOffsetAdd(out_total, SpeculateOutputRows(args, b));
    args.cu_seqlens_q[b + 1] = static_cast<int32_t>(in_total);
    args.cu_seqlens_k[b + 1] = static_cast<int32_t>(in_total);
    args.cu_seq_lens_q_output[b + 1] = static_cast<int32_t>(out_total);
  }
  *args.real_output_token_num = static_cast<int32_t>(out_total);
  for (int64_t b = 0; b < args.bsz; ++b) {
    // Bounded by the buffers (T tokens, N * W rows in all), not by the length values.
    const int64_t tokens = SpeculateTokensInBounds(args, b);
    for (int64_t i = 0; i < tokens; ++i) SpeculatePreProcessToken(args, b, i);
    const int64_t rows = SpeculateRowsInBounds(args, b);
    for (int64_t j = 0; j < rows; ++j) SpeculatePreProcessOutputRow(args, b, j);
  }
}

}  // namespace cpu
// The checks on the inputs and cpu_token_num: they run before the outputs, whose sizes
// cpu_token_num sets, are checked (the Paddle binding: before it allocates them).
void PrepareInputs(const ArgChecker& check, const SpeculatePreProcessCall& call) {
  check.AttrAtLeast("cpu_token_num", call.cpu_token_num, 0);
  const TensorRef& seq_len = call.seq_len;
  const int64_t bsz = check.ItemCount(seq_len);
  check.PerItem(call.seq_lens_encoder, bsz, seq_len);
  check.PerItem(call.seq_lens_decoder, bsz, seq_len);
  check.Rows(call.input_ids, bsz, seq_len);
  check.Rows(call.draft_tokens, bsz, seq_len);
  // Each item's tokens come from its own row of input_ids (C slots) or of draft_tokens (W
  // slots), so a sum of real lengths is at most N * max(C, W): T beyond that cannot be one,
  // and would only ask for outputs of fill values. No overflow: each tensor holds at least
  // N rows of its width, and its element count fits in int64 (ArgChecker::Storage).
  const int64_t ids_width = call.input_ids.dim(1);
  const int64_t draft_width = call.draft_tokens.dim(1);
  const int64_t capacity = bsz * std::max(ids_width, draft_width);
  if (call.cpu_token_num > capacity) {
    check.Fail("attr `cpu_token_num` must be <= " + std::to_string(capacity) +
               ", the most tokens the batch's rows hold (" + std::to_string(bsz) +
               " items from `seq_len`, each at most max(`input_ids` width " +
               std::to_string(ids_width) + ", `draft_tokens` width " + std::to_string(draft_width) +
               ") tokens), got " + std::to_string(call.cpu_token_num));
  }
}

void Prepare(const ArgChecker& check, const SpeculatePreProcessCall& call,
             SpeculatePreProcessArgs* args) {
  // PrepareInputs has checked the inputs and cpu_token_num.
  const int64_t bsz = call.seq_len.dim(0);
  check.Numel(call.ids_remove_padding, call.cpu_token_num);
  check.Numel(call.batch_id_per_token, call.cpu_token_num);
  check.Numel(call.cu_seqlens_q, bsz + 1);
  check.Numel(call.cu_seqlens_k, bsz + 1);
  check.Numel(call.cu_seq_lens_q_output, bsz + 1);
  check.Numel(call.batch_id_per_token_output, bsz * call.draft_tokens.dim(1));
  check.Numel(call.real_output_token_num, 1);
  // No value checks: a negative length counts as 0 and the offsets saturate, the same on
  // every backend (fdmtp/speculate_pre_process.h). bsz * W cannot overflow: draft_tokens
  // holds at least bsz rows of W elements.
  args->bsz = bsz;
  args->input_ids_len = call.input_ids.dim(1);
  args->draft_width = call.draft_tokens.dim(1);
  args->output_capacity = bsz * call.draft_tokens.dim(1);
}

}  // namespace fdmtp
