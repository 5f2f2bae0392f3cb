#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void DraftModelPostprocess(const DraftModelPostprocessArgs& args) {
  for (int64_t b = 0; b < args.bsz; ++b) DraftModelPostprocessItem(args, b);
}

}  // namespace cpu
// The batch size N is seq_lens_this_time's, as on upstream's GPU path; every other tensor
// has at least N rows (the general per-item convention: rows past N are never read or
// written), and the draft rows are read with the draft tensor's own width.
void Prepare(const ArgChecker& check, const DraftModelPostprocessCall& call,
             DraftModelPostprocessArgs* args) {
  const TensorRef& draft = call.base_model_draft_tokens;
  const TensorRef& slt = call.base_model_seq_lens_this_time;
  const int64_t bsz = check.ItemCount(slt);
  check.Rows(draft, bsz, slt);
  check.PerItem(call.base_model_seq_lens_encoder, bsz, slt);
  check.PerItem(call.base_model_stop_flags, bsz, slt);
  args->bsz = bsz;
  args->width = draft.dim(1);
}

}  // namespace fdmtp
