#include "fdmtp/ops.h"
#include "ngram_common.h"

namespace fdmtp {

void HybridMtpNgram(const TensorRef& input_ids, const TensorRef& input_ids_len,
                    const TensorRef& pre_ids, const TensorRef& step_idx,
                    const TensorRef& draft_token_num, const TensorRef& draft_tokens,
                    const TensorRef& seq_lens_this_time, const TensorRef& seq_lens_decoder,
                    const TensorRef& max_dec_len, int max_ngram_size, int min_ngram_size,
                    int max_draft_tokens, int threshold, int num_threads, void* stream,
                    ScratchAllocator* scratch) {
  const ArgChecker check("hybrid_mtp_ngram");
  const TensorRef& slt = seq_lens_this_time;
  const std::vector<const TensorRef*> all = {&input_ids,    &input_ids_len, &pre_ids,
                                             &step_idx,     &draft_token_num, &draft_tokens,
                                             &slt,          &seq_lens_decoder, &max_dec_len};
  check.SameDevice(all);
  for (const TensorRef* t : {&input_ids, &input_ids_len, &pre_ids, &step_idx, &draft_tokens,
                             &max_dec_len}) {
    check.Dtype(*t, DType::kInt64);
  }
  for (const TensorRef* t : {&draft_token_num, &slt, &seq_lens_decoder}) {
    check.Dtype(*t, DType::kInt32);
  }
  if (slt.shape.empty()) check.Rank(slt, 1);
  const int64_t bsz = slt.dim(0);
  check.PerItem(slt, bsz, slt);
  for (const TensorRef* t : {&input_ids_len, &step_idx, &draft_token_num, &seq_lens_decoder,
                             &max_dec_len}) {
    check.PerItem(*t, bsz, slt);
  }
  for (const TensorRef* t : {&input_ids, &pre_ids, &draft_tokens}) {
    ngram_entry::RowsMatch(check, *t, slt);
  }
  for (const TensorRef* t : all) check.Contiguous(*t);
  ngram_entry::AttrAtLeast(check, "min_ngram_size", min_ngram_size, 1);
  ngram_entry::AttrAtLeast(check, "max_ngram_size", max_ngram_size, min_ngram_size);
  ngram_entry::AttrAtLeast(check, "max_draft_tokens", max_draft_tokens, 0);
  if (draft_tokens.dim(1) < static_cast<int64_t>(max_draft_tokens) + 1) {
    check.Fail("`draft_tokens` must have at least max_draft_tokens + 1 = " +
               std::to_string(max_draft_tokens + 1) + " columns, got shape " +
               draft_tokens.ShapeString());
  }

  HybridMtpNgramArgs args;
  args.input_ids = input_ids.ptr<const int64_t>();
  args.input_ids_len = input_ids_len.ptr<const int64_t>();
  args.pre_ids = pre_ids.ptr<const int64_t>();
  args.step_idx = step_idx.ptr<const int64_t>();
  args.draft_tokens = draft_tokens.ptr<int64_t>();
  args.seq_lens_this_time = slt.ptr<int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<const int32_t>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.bsz = bsz;
  args.input_width = input_ids.dim(1);
  args.pre_width = pre_ids.dim(1);
  args.draft_width = draft_tokens.dim(1);
  args.max_ngram_size = max_ngram_size;
  args.min_ngram_size = min_ngram_size;
  args.max_draft_tokens = max_draft_tokens;
  args.threshold = threshold;
  ngram_entry::Run(
      check, slt.device, bsz, scratch, [&] { cpu::HybridMtpNgram(args, num_threads); },
      [&](void* workspace) { return cuda::HybridMtpNgram(args, workspace, stream); },
      [&](xpu::Context* ctx) { return xpu::hybrid_mtp_ngram(ctx, args); });
}

}  // namespace fdmtp
