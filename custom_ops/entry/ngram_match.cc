#include "fdmtp/ops.h"
#include "ngram_common.h"

namespace fdmtp {

void NgramMatch(const TensorRef& input_ids, const TensorRef& input_ids_len,
                const TensorRef& token_ids_all, const TensorRef& prompt_lens,
                const TensorRef& step_idx, const TensorRef& draft_token_num,
                const TensorRef& draft_tokens, const TensorRef& seq_lens_this_time,
                const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                const TensorRef& max_dec_len, int max_ngram_size, int max_draft_tokens,
                int threshold, int num_threads, void* stream, ScratchAllocator* scratch) {
  const ArgChecker check("ngram_match");
  const TensorRef& slt = seq_lens_this_time;
  const std::vector<const TensorRef*> all = {
      &input_ids,    &input_ids_len, &token_ids_all,    &prompt_lens,      &step_idx,   &draft_token_num,
      &draft_tokens, &slt,           &seq_lens_encoder, &seq_lens_decoder, &max_dec_len};
  check.SameDevice(all);
  for (const TensorRef* t : {&input_ids, &input_ids_len, &token_ids_all, &prompt_lens, &step_idx,
                             &draft_tokens, &max_dec_len}) {
    check.Dtype(*t, DType::kInt64);
  }
  for (const TensorRef* t : {&draft_token_num, &slt, &seq_lens_encoder, &seq_lens_decoder}) {
    check.Dtype(*t, DType::kInt32);
  }
  if (slt.shape.empty()) check.Rank(slt, 1);
  const int64_t bsz = slt.dim(0);
  check.PerItem(slt, bsz, slt);
  for (const TensorRef* t : {&input_ids_len, &prompt_lens, &step_idx, &draft_token_num,
                             &seq_lens_encoder, &seq_lens_decoder, &max_dec_len}) {
    check.PerItem(*t, bsz, slt);
  }
  for (const TensorRef* t : {&input_ids, &token_ids_all, &draft_tokens}) {
    ngram_entry::RowsMatch(check, *t, slt);
  }
  for (const TensorRef* t : all) check.Contiguous(*t);
  ngram_entry::AttrAtLeast(check, "max_ngram_size", max_ngram_size, 1);
  ngram_entry::AttrAtLeast(check, "max_draft_tokens", max_draft_tokens, 0);
  if (draft_tokens.dim(1) < 1) {
    check.Fail("`draft_tokens` must have at least 1 column, got shape " +
               draft_tokens.ShapeString());
  }

  NgramMatchArgs args;
  args.input_ids = input_ids.ptr<const int64_t>();
  args.input_ids_len = input_ids_len.ptr<const int64_t>();
  args.token_ids_all = token_ids_all.ptr<const int64_t>();
  args.prompt_lens = prompt_lens.ptr<const int64_t>();
  args.step_idx = step_idx.ptr<const int64_t>();
  args.draft_token_num = draft_token_num.ptr<const int32_t>();
  args.draft_tokens = draft_tokens.ptr<int64_t>();
  args.seq_lens_this_time = slt.ptr<int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<const int32_t>();
  args.max_dec_len = max_dec_len.ptr<const int64_t>();
  args.bsz = bsz;
  args.input_width = input_ids.dim(1);
  args.all_width = token_ids_all.dim(1);
  args.draft_width = draft_tokens.dim(1);
  args.max_ngram_size = max_ngram_size;
  args.threshold = threshold;
  ngram_entry::Run(
      check, slt.device, bsz, scratch, [&] { cpu::NgramMatch(args, num_threads); },
      [&](void* workspace) { return cuda::NgramMatch(args, workspace, stream); },
      [&](xpu::Context* ctx) { return xpu::ngram_match(ctx, args); });
}

}  // namespace fdmtp
