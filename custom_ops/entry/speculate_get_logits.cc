#include "checks.h"
#include "dispatch.h"
#include "fdmtp/dtype_dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void SpeculateGetLogits(const TensorRef& draft_logits, const TensorRef& next_token_num,
                        const TensorRef& batch_token_num, const TensorRef& cu_next_token_offset,
                        const TensorRef& cu_batch_token_offset, const TensorRef& logits,
                        const TensorRef& first_token_logits, const TensorRef& seq_lens_this_time,
                        const TensorRef& seq_lens_encoder, void* stream) {
  const ArgChecker check("speculate_get_logits");
  check.SameDevice({&draft_logits, &next_token_num, &batch_token_num, &cu_next_token_offset,
                    &cu_batch_token_offset, &logits, &first_token_logits, &seq_lens_this_time,
                    &seq_lens_encoder});
  const int64_t bsz = BatchSize(check, seq_lens_this_time);
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &next_token_num,
                             &batch_token_num}) {
    CheckPerItemInt32(check, *t, bsz, seq_lens_this_time);
  }
  const std::string offsets = "batch size + 1, batch size from `seq_lens_this_time`";
  CheckShape(check, cu_next_token_offset, DType::kInt32, {bsz + 1}, offsets);
  CheckShape(check, cu_batch_token_offset, DType::kInt32, {bsz + 1}, offsets);
  DispatchFloat(check, draft_logits, [](auto) {});
  check.Rank(draft_logits, 2);
  check.Contiguous(draft_logits);
  const int64_t vocab = draft_logits.dim(1);
  check.Dtype(logits, draft_logits.dtype);
  check.Rank(logits, 2);
  check.DimEq(logits, 1, draft_logits, 1);
  check.Contiguous(logits);
  CheckShape(check, first_token_logits, draft_logits.dtype, {bsz, vocab},
             "batch size from `seq_lens_this_time`, vocab from `draft_logits`");

  SpeculateGetLogitsArgs args;
  args.draft_logits = draft_logits.data;
  args.next_token_num = next_token_num.ptr<int32_t>();
  args.batch_token_num = batch_token_num.ptr<int32_t>();
  args.cu_next_token_offset = cu_next_token_offset.ptr<int32_t>();
  args.cu_batch_token_offset = cu_batch_token_offset.ptr<int32_t>();
  args.logits = logits.data;
  args.first_token_logits = first_token_logits.data;
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.bsz = bsz;
  args.vocab = vocab;
  args.draft_rows = draft_logits.dim(0);
  args.logit_rows = logits.dim(0);
  DispatchFloat(check, draft_logits, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Dispatch(
        check, draft_logits.device, [&] { cpu::SpeculateGetLogits<T>(args); },
        [&] { return cuda::SpeculateGetLogits<T>(args, stream); },
      [&](xpu::Context* ctx) { return xpu::speculate_get_logits<T>(ctx, args); });
  });
}

}  // namespace fdmtp
