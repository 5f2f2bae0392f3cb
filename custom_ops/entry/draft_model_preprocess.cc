#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void DraftModelPreprocess(const TensorRef& draft_tokens, const TensorRef& input_ids,
                          const TensorRef& stop_flags, const TensorRef& seq_lens_this_time,
                          const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                          const TensorRef& step_idx, const TensorRef& not_need_stop,
                          const TensorRef& pre_ids, const TensorRef& accept_tokens,
                          const TensorRef& accept_num,
                          const TensorRef& target_model_seq_lens_encoder,
                          const TensorRef& target_model_seq_lens_decoder,
                          const TensorRef& target_model_step_idx,
                          const TensorRef& target_model_stop_flags, const TensorRef& max_dec_len,
                          const TensorRef& target_model_draft_tokens, int num_model_step,
                          bool is_splitwise_prefill, void* stream) {
  const ArgChecker check("draft_model_preprocess");
  const std::vector<const TensorRef*> all = {
      &draft_tokens, &input_ids, &stop_flags, &seq_lens_this_time, &seq_lens_encoder,
      &seq_lens_decoder, &step_idx, &not_need_stop, &pre_ids, &accept_tokens, &accept_num,
      &target_model_seq_lens_encoder, &target_model_seq_lens_decoder, &target_model_step_idx,
      &target_model_stop_flags, &max_dec_len, &target_model_draft_tokens};
  check.SameDevice(all);
  for (const TensorRef* t : {&draft_tokens, &input_ids, &step_idx, &pre_ids, &accept_tokens,
                             &target_model_step_idx, &max_dec_len, &target_model_draft_tokens}) {
    check.Dtype(*t, DType::kInt64);
  }
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder, &accept_num,
                             &target_model_seq_lens_encoder, &target_model_seq_lens_decoder}) {
    check.Dtype(*t, DType::kInt32);
  }
  for (const TensorRef* t : {&stop_flags, &not_need_stop, &target_model_stop_flags}) {
    check.Dtype(*t, DType::kBool);
  }
  const int64_t bsz = check.ItemCount(seq_lens_this_time);
  for (const TensorRef* t : {&stop_flags, &seq_lens_encoder, &seq_lens_decoder, &step_idx,
                             &accept_num, &target_model_seq_lens_encoder,
                             &target_model_seq_lens_decoder, &target_model_step_idx,
                             &target_model_stop_flags, &max_dec_len}) {
    check.PerItem(*t, bsz, seq_lens_this_time);
  }
  for (const TensorRef* t : {&draft_tokens, &input_ids, &pre_ids, &accept_tokens,
                             &target_model_draft_tokens}) {
    check.Rows(*t, bsz, seq_lens_this_time);
  }
  // Draft rows, accepted rows and the target's draft rows are all K + 1 wide.
  check.DimEq(accept_tokens, 1, draft_tokens, 1);
  check.DimEq(target_model_draft_tokens, 1, draft_tokens, 1);
  check.Numel(not_need_stop, 1);
  check.AttrAtLeast("num_model_step", num_model_step, 1);
  for (const TensorRef* t : all) check.Contiguous(*t);
  // Host tensors are value-checked; device tensors are not read back (no sync): the kernel
  // clamps accept_num to [0, W] instead.
  check.ValuesInRangeOnHost(accept_num, 0, draft_tokens.dim(1));

  DraftModelPreprocessArgs args;
  args.draft_tokens = draft_tokens.ptr<int64_t>();
  args.input_ids = input_ids.ptr<int64_t>();
  args.stop_flags = stop_flags.ptr<bool>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<int32_t>();
  args.step_idx = step_idx.ptr<int64_t>();
  args.not_need_stop = not_need_stop.ptr<bool>();
  args.pre_ids = pre_ids.ptr<int64_t>();
  args.accept_tokens = accept_tokens.ptr<const int64_t>();
  args.accept_num = accept_num.ptr<const int32_t>();
  args.target_model_seq_lens_decoder = target_model_seq_lens_decoder.ptr<const int32_t>();
  args.target_model_step_idx = target_model_step_idx.ptr<const int64_t>();
  args.target_model_stop_flags = target_model_stop_flags.ptr<const bool>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.target_model_draft_tokens = target_model_draft_tokens.ptr<int64_t>();
  args.bsz = bsz;
  args.draft_width = draft_tokens.dim(1);
  args.accept_width = accept_tokens.dim(1);
  args.target_draft_width = target_model_draft_tokens.dim(1);
  args.input_ids_len = input_ids.dim(1);
  args.pre_ids_len = pre_ids.dim(1);
  args.num_model_step = num_model_step;
  args.is_splitwise_prefill = is_splitwise_prefill;
  Dispatch(
      check, seq_lens_this_time.device, [&] { cpu::DraftModelPreprocess(args); },
      [&] { return cuda::DraftModelPreprocess(args, stream); },
      [&](xpu::Context* ctx) { return xpu::draft_model_preprocess(ctx, args); });
}

}  // namespace fdmtp
