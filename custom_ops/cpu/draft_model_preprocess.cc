#include "fdmtp/ops.h"

namespace fdmtp {
namespace cpu {

void DraftModelPreprocess(const DraftModelPreprocessArgs& args) {
  bool any_kept = false;
  for (int64_t b = 0; b < args.bsz; ++b) any_kept = DraftModelPreprocessItem(args, b) || any_kept;
  *args.not_need_stop = any_kept;
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const DraftModelPreprocessCall& call,
             DraftModelPreprocessArgs* args) {
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = check.ItemCount(slt);
  check.PerItem(
      {&call.stop_flags, &call.seq_lens_encoder, &call.seq_lens_decoder, &call.step_idx,
       &call.accept_num, &call.target_model_seq_lens_encoder, &call.target_model_seq_lens_decoder,
       &call.target_model_step_idx, &call.target_model_stop_flags, &call.max_dec_len},
      bsz, slt);
  check.Rows({&call.draft_tokens, &call.input_ids, &call.pre_ids, &call.accept_tokens,
              &call.target_model_draft_tokens},
             bsz, slt);
  // Each row tensor is read with its own width (upstream's tests pass draft_tokens [N, 4],
  // accept_tokens [N, 100] and target_model_draft_tokens [N, 10] in one call).
  check.Numel(call.not_need_stop, 1);
  check.AttrAtLeast("num_model_step", call.num_model_step, 1);
  // Values (accept_num, steps, lengths) are not checked on the host on any backend: the
  // shared per-item logic clamps them the same way on CPU, CUDA and XPU.
  args->bsz = bsz;
  args->draft_width = call.draft_tokens.dim(1);
  args->accept_width = call.accept_tokens.dim(1);
  args->target_draft_width = call.target_model_draft_tokens.dim(1);
  args->input_ids_len = call.input_ids.dim(1);
  args->pre_ids_len = call.pre_ids.dim(1);
}

}  // namespace fdmtp
