#include <limits>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void SpeculatePreProcess(const TensorRef& input_ids, const TensorRef& seq_len,
                         const TensorRef& draft_tokens, const TensorRef& seq_lens_encoder,
                         const TensorRef& seq_lens_decoder, const TensorRef& ids_remove_padding,
                         const TensorRef& batch_id_per_token, const TensorRef& cu_seqlens_q,
                         const TensorRef& cu_seqlens_k, const TensorRef& cu_seq_lens_q_output,
                         const TensorRef& batch_id_per_token_output,
                         const TensorRef& real_output_token_num, int64_t cpu_token_num,
                         void* stream) {
  const ArgChecker check("speculate_pre_process");
  const std::vector<const TensorRef*> all = {
      &input_ids,          &seq_len,       &draft_tokens,         &seq_lens_encoder,
      &seq_lens_decoder,   &ids_remove_padding, &batch_id_per_token, &cu_seqlens_q,
      &cu_seqlens_k,       &cu_seq_lens_q_output, &batch_id_per_token_output,
      &real_output_token_num};
  check.SameDevice(all);
  for (const TensorRef* t : {&input_ids, &draft_tokens, &ids_remove_padding}) {
    check.Dtype(*t, DType::kInt64);
  }
  for (const TensorRef* t : {&seq_len, &seq_lens_encoder, &seq_lens_decoder, &batch_id_per_token,
                             &cu_seqlens_q, &cu_seqlens_k, &cu_seq_lens_q_output,
                             &batch_id_per_token_output, &real_output_token_num}) {
    check.Dtype(*t, DType::kInt32);
  }
  check.AttrAtLeast("cpu_token_num", cpu_token_num, 0);
  const int64_t bsz = check.ItemCount(seq_len);
  check.PerItem(seq_lens_encoder, bsz, seq_len);
  check.PerItem(seq_lens_decoder, bsz, seq_len);
  check.Rows(input_ids, bsz, seq_len);
  check.Rows(draft_tokens, bsz, seq_len);
  check.Numel(ids_remove_padding, cpu_token_num);
  check.Numel(batch_id_per_token, cpu_token_num);
  check.Numel(cu_seqlens_q, bsz + 1);
  check.Numel(cu_seqlens_k, bsz + 1);
  check.Numel(cu_seq_lens_q_output, bsz + 1);
  check.Numel(batch_id_per_token_output, bsz * draft_tokens.dim(1));
  check.Numel(real_output_token_num, 1);
  for (const TensorRef* t : all) check.Contiguous(*t);
  check.ValuesInRangeOnHost(seq_len, 0, std::numeric_limits<int32_t>::max());

  SpeculatePreProcessArgs args;
  args.input_ids = input_ids.ptr<const int64_t>();
  args.seq_lens_this_time = seq_len.ptr<const int32_t>();
  args.draft_tokens = draft_tokens.ptr<const int64_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.ids_remove_padding = ids_remove_padding.ptr<int64_t>();
  args.batch_id_per_token = batch_id_per_token.ptr<int32_t>();
  args.cu_seqlens_q = cu_seqlens_q.ptr<int32_t>();
  args.cu_seqlens_k = cu_seqlens_k.ptr<int32_t>();
  args.cu_seq_lens_q_output = cu_seq_lens_q_output.ptr<int32_t>();
  args.batch_id_per_token_output = batch_id_per_token_output.ptr<int32_t>();
  args.real_output_token_num = real_output_token_num.ptr<int32_t>();
  args.bsz = bsz;
  args.input_ids_len = input_ids.dim(1);
  args.draft_width = draft_tokens.dim(1);
  args.token_num = cpu_token_num;
  args.output_capacity = bsz * draft_tokens.dim(1);
  Dispatch(
      check, seq_len.device, [&] { cpu::SpeculatePreProcess(args); },
      [&] { return cuda::SpeculatePreProcess(args, stream); },
      [&](xpu::Context* ctx) { return xpu::speculate_pre_process(ctx, args); });
}

}  // namespace fdmtp
