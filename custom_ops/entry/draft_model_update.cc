#include <limits>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void DraftModelUpdate(const TensorRef& inter_next_tokens, const TensorRef& draft_tokens,
                      const TensorRef& pre_ids, const TensorRef& seq_lens_this_time,
                      const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                      const TensorRef& step_idx, const TensorRef& cu_seqlens_q_output,
                      const TensorRef& stop_flags, const TensorRef& not_need_stop,
                      const TensorRef& max_dec_len, const TensorRef& end_ids,
                      const TensorRef& base_model_draft_tokens, int max_seq_len, int substep,
                      void* stream) {
  const ArgChecker check("draft_model_update");
  const std::vector<const TensorRef*> all = {
      &inter_next_tokens, &draft_tokens, &pre_ids, &seq_lens_this_time, &seq_lens_encoder,
      &seq_lens_decoder, &step_idx, &cu_seqlens_q_output, &stop_flags, &not_need_stop,
      &max_dec_len, &end_ids, &base_model_draft_tokens};
  check.SameDevice(all);
  for (const TensorRef* t : {&inter_next_tokens, &draft_tokens, &pre_ids, &step_idx, &max_dec_len,
                             &end_ids, &base_model_draft_tokens}) {
    check.Dtype(*t, DType::kInt64);
  }
  for (const TensorRef* t :
       {&seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder, &cu_seqlens_q_output}) {
    check.Dtype(*t, DType::kInt32);
  }
  check.Dtype(stop_flags, DType::kBool);
  check.Dtype(not_need_stop, DType::kBool);
  const int64_t bsz = check.ItemCount(seq_lens_this_time);
  for (const TensorRef* t : {&seq_lens_encoder, &seq_lens_decoder, &step_idx, &stop_flags,
                             &max_dec_len}) {
    check.PerItem(*t, bsz, seq_lens_this_time);
  }
  for (const TensorRef* t : {&draft_tokens, &pre_ids, &base_model_draft_tokens}) {
    check.Rows(*t, bsz, seq_lens_this_time);
  }
  check.DimEq(base_model_draft_tokens, 1, draft_tokens, 1);
  if (draft_tokens.dim(1) < 1) check.Fail("`draft_tokens` must have at least one column");
  // cu_seqlens_q_output and end_ids are accepted for FastDeploy compatibility and unused
  // (develop's kernel reads neither); their shapes are still checked.
  if (cu_seqlens_q_output.numel() < bsz + 1) {
    check.Fail("`cu_seqlens_q_output` must have at least bsz + 1 = " + std::to_string(bsz + 1) +
               " elements, got shape " + cu_seqlens_q_output.ShapeString());
  }
  check.Numel(not_need_stop, 1);
  check.AttrAtLeast("max_seq_len", max_seq_len, 0);
  check.AttrAtLeast("substep", substep, 0);
  if (substep + 1 >= base_model_draft_tokens.dim(1)) {
    check.Fail("attr `substep` = " + std::to_string(substep) +
               " writes slot substep + 1 of `base_model_draft_tokens`, which has only " +
               std::to_string(base_model_draft_tokens.dim(1)) + " columns (K + 1)");
  }
  for (const TensorRef* t : all) check.Contiguous(*t);
  // Host tensors are value-checked (device tensors are not read back: no sync).
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder}) {
    check.ValuesInRangeOnHost(*t, 0, std::numeric_limits<int32_t>::max());
  }

  DraftModelUpdateArgs args;
  args.inter_next_tokens = inter_next_tokens.ptr<const int64_t>();
  args.draft_tokens = draft_tokens.ptr<int64_t>();
  args.pre_ids = pre_ids.ptr<int64_t>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<int32_t>();
  args.step_idx = step_idx.ptr<int64_t>();
  args.stop_flags = stop_flags.ptr<bool>();
  args.not_need_stop = not_need_stop.ptr<bool>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.base_model_draft_tokens = base_model_draft_tokens.ptr<int64_t>();
  args.bsz = bsz;
  args.num_tokens = inter_next_tokens.numel();
  args.draft_width = draft_tokens.dim(1);
  args.base_width = base_model_draft_tokens.dim(1);
  args.pre_ids_len = pre_ids.dim(1);
  args.substep = substep;
  Dispatch(
      check, seq_lens_this_time.device, [&] { cpu::DraftModelUpdate(args); },
      [&] { return cuda::DraftModelUpdate(args, stream); },
      [&](xpu::Context* ctx) { return xpu::draft_model_update(ctx, args); });
}

}  // namespace fdmtp
