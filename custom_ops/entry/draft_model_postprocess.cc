#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void DraftModelPostprocess(const TensorRef& base_model_draft_tokens,
                           const TensorRef& base_model_seq_lens_this_time,
                           const TensorRef& base_model_seq_lens_encoder,
                           const TensorRef& base_model_stop_flags, void* stream) {
  const ArgChecker check("draft_model_postprocess");
  const TensorRef& draft = base_model_draft_tokens;
  const TensorRef& slt = base_model_seq_lens_this_time;
  check.SameDevice({&draft, &slt, &base_model_seq_lens_encoder, &base_model_stop_flags});
  check.Dtype(draft, DType::kInt64);
  check.Dtype(slt, DType::kInt32);
  check.Dtype(base_model_seq_lens_encoder, DType::kInt32);
  check.Dtype(base_model_stop_flags, DType::kBool);
  check.Rank(draft, 2);
  // The batch size is seq_lens_this_time's, as on upstream's GPU path; every other tensor
  // must agree instead of being silently over- or under-read.
  const int64_t bsz = check.ItemCount(slt);
  check.DimEq(draft, 0, slt, 0);
  check.PerItem(base_model_seq_lens_encoder, bsz, slt);
  check.PerItem(base_model_stop_flags, bsz, slt);
  for (const TensorRef* t : {&draft, &slt, &base_model_seq_lens_encoder, &base_model_stop_flags}) {
    check.Contiguous(*t);
  }

  DraftModelPostprocessArgs args;
  args.draft_tokens = draft.ptr<const int64_t>();
  args.seq_lens_this_time = slt.ptr<int32_t>();
  args.seq_lens_encoder = base_model_seq_lens_encoder.ptr<const int32_t>();
  args.stop_flags = base_model_stop_flags.ptr<const bool>();
  args.bsz = bsz;
  args.width = draft.dim(1);
  Dispatch(
      check, draft.device, [&] { cpu::DraftModelPostprocess(args); },
      [&] { return cuda::DraftModelPostprocess(args, stream); },
      [&](xpu::Context* ctx) { return xpu::draft_model_postprocess(ctx, args); });
}

}  // namespace fdmtp
