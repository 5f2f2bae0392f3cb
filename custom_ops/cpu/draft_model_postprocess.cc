#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void DraftModelPostprocess(const DraftModelPostprocessArgs& args) {
  for (int64_t b = 0; b < args.bsz; ++b) DraftModelPostprocessItem(args, b);
}

}  // namespace cpu
// The batch size is seq_lens_this_time's, as on upstream's GPU path; every other tensor must
// agree instead of being silently over- or under-read.
void Prepare(const ArgChecker& check, const DraftModelPostprocessCall& call,
             DraftModelPostprocessArgs* args) {
  const TensorRef& draft = call.base_model_draft_tokens;
  const TensorRef& slt = call.base_model_seq_lens_this_time;
  check.Rank(draft, 2);
  const int64_t bsz = check.ItemCount(slt);
  check.DimEq(draft, 0, slt, 0);
  check.PerItem(call.base_model_seq_lens_encoder, bsz, slt);
  check.PerItem(call.base_model_stop_flags, bsz, slt);
  args->bsz = bsz;
  args->width = draft.dim(1);
}

}  // namespace fdmtp
