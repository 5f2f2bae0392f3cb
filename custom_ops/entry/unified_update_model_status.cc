#include <limits>
#include <string>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void UnifiedUpdateModelStatus(const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                              const TensorRef& has_running_seqs, const TensorRef& step_input_ids,
                              const TensorRef& step_output_ids, const TensorRef& step_output_len,
                              const TensorRef& stop_flags, const TensorRef& seq_lens_this_time,
                              const TensorRef& is_paused, const TensorRef& token_ids_all,
                              const TensorRef& prompt_lens, const TensorRef& step_idx,
                              const TensorRef& end_tokens, const TensorRef& max_dec_len,
                              void* stream) {
  const ArgChecker check("unified_update_model_status");
  const std::vector<const TensorRef*> all = {
      &seq_lens_encoder, &seq_lens_decoder,   &has_running_seqs, &step_input_ids, &step_output_ids,
      &step_output_len,  &stop_flags,         &seq_lens_this_time, &is_paused,    &token_ids_all,
      &prompt_lens,      &step_idx,           &end_tokens,       &max_dec_len};
  check.SameDevice(all);
  check.Dtype(seq_lens_encoder, DType::kInt32);
  check.Dtype(seq_lens_decoder, DType::kInt32);
  check.Dtype(has_running_seqs, DType::kBool);
  check.Dtype(step_input_ids, DType::kInt64);
  check.Dtype(step_output_ids, DType::kInt64);
  check.Dtype(step_output_len, DType::kInt32);
  check.Dtype(stop_flags, DType::kBool);
  check.Dtype(seq_lens_this_time, DType::kInt32);
  check.Dtype(is_paused, DType::kBool);
  check.Dtype(token_ids_all, DType::kInt64);
  check.Dtype(prompt_lens, DType::kInt64);
  check.Dtype(step_idx, DType::kInt64);
  check.Dtype(end_tokens, DType::kInt64);
  check.Dtype(max_dec_len, DType::kInt64);

  // Slots: max_bsz from stop_flags (as upstream); items: real_bsz from seq_lens_this_time.
  const int64_t max_bsz = check.ItemCount(stop_flags);
  for (const TensorRef* t : {&seq_lens_encoder, &seq_lens_decoder, &step_output_len, &is_paused,
                             &prompt_lens, &step_idx, &max_dec_len}) {
    check.PerItem(*t, max_bsz, stop_flags);
  }
  check.Rank(step_input_ids, 2);
  check.Rank(step_output_ids, 2);
  check.Rank(token_ids_all, 2);
  check.DimEq(step_input_ids, 0, stop_flags, 0);
  check.DimEq(step_output_ids, 0, stop_flags, 0);
  check.DimEq(step_output_ids, 1, step_input_ids, 1);
  check.DimEq(token_ids_all, 0, stop_flags, 0);
  const int64_t real_bsz = check.ItemCount(seq_lens_this_time);
  if (real_bsz > max_bsz) {
    check.Fail("`seq_lens_this_time` has " + std::to_string(real_bsz) +
               " items but `stop_flags` has only " + std::to_string(max_bsz) + " slots");
  }
  if (has_running_seqs.numel() != 1) {
    check.Fail("`has_running_seqs` must hold exactly one element, got shape " +
               has_running_seqs.ShapeString());
  }
  const int64_t num_end_tokens = check.ItemCount(end_tokens);
  if (num_end_tokens < 1) check.Fail("`end_tokens` must hold at least one EOS id, got none");
  for (const TensorRef* t : all) check.Contiguous(*t);
  const int64_t width = step_output_ids.dim(1);
  // Value checks that need no device sync (host tensors only; the kernel clamps the
  // emitted count into [0, K + 1] and skips a history write before position 0).
  check.ValuesInRangeOnHost(step_output_len, 0, width);
  check.ValuesInRangeOnHost(prompt_lens, 0, std::numeric_limits<int64_t>::max());

  UnifiedUpdateModelStatusArgs args;
  args.seq_lens_encoder = seq_lens_encoder.ptr<int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<int32_t>();
  args.has_running_seqs = has_running_seqs.ptr<bool>();
  args.step_input_ids = step_input_ids.ptr<int64_t>();
  args.step_output_ids = step_output_ids.ptr<int64_t>();
  args.step_output_len = step_output_len.ptr<int32_t>();
  args.stop_flags = stop_flags.ptr<bool>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<int32_t>();
  args.is_paused = is_paused.ptr<const bool>();
  args.token_ids_all = token_ids_all.ptr<int64_t>();
  args.prompt_lens = prompt_lens.ptr<const int64_t>();
  args.step_idx = step_idx.ptr<int64_t>();
  args.end_tokens = end_tokens.ptr<const int64_t>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.max_bsz = max_bsz;
  args.real_bsz = real_bsz;
  args.width = width;
  args.max_model_len = token_ids_all.dim(1);
  args.num_end_tokens = num_end_tokens;
  Dispatch(
      check, stop_flags.device, [&] { cpu::UnifiedUpdateModelStatus(args); },
      [&] { return cuda::UnifiedUpdateModelStatus(args, stream); },
      [&](xpu::Context* ctx) { return xpu::unified_update_model_status(ctx, args); });
}

}  // namespace fdmtp
