#include <string>
#include "entry/checks.h"
#include "fdmtp/ops.h"
#include "ngram_cpu.h"

namespace fdmtp {
namespace cpu {

void NgramMatch(const NgramMatchArgs& args, int num_threads) {
  RunNgram<NgramMatchOp>(args, args.bsz, args.max_ngram_size, 1, args.threshold, num_threads);
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const NgramMatchCall& call, NgramMatchArgs* args) {
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = BatchSize(check, slt);
  check.PerItem(
      {&slt, &call.input_ids_len, &call.prompt_lens, &call.step_idx, &call.draft_token_num,
       &call.seq_lens_encoder, &call.seq_lens_decoder, &call.max_dec_len},
      bsz, slt);
  // rows past the batch are not read
  check.Rows({&call.input_ids, &call.token_ids_all, &call.draft_tokens}, bsz, slt);
  check.AttrAtLeast("max_ngram_size", call.max_ngram_size, 1);
  CheckMaxNgramSize(check, call.max_ngram_size);
  check.AttrAtLeast("max_draft_tokens", call.max_draft_tokens, 0);
  if (call.draft_tokens.dim(1) < 1) {
    check.Fail("`draft_tokens` must have at least 1 column, got shape " +
               call.draft_tokens.ShapeString());
  }
  args->bsz = bsz;
  args->input_width = call.input_ids.dim(1);
  args->all_width = call.token_ids_all.dim(1);
  args->draft_width = call.draft_tokens.dim(1);
}

}  // namespace fdmtp
