#include "checks.h"
#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void UpdateAttnMaskOffsets(const TensorRef& ids_remove_padding, const TensorRef& seq_lens_this_time,
                           const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                           const TensorRef& cu_seqlens_q, const TensorRef& attn_mask_offsets_full,
                           const TensorRef& is_block_step, const TensorRef& decode_states,
                           const TensorRef& attn_mask_offsets, void* stream) {
  const ArgChecker check("update_attn_mask_offsets");
  check.SameDevice({&ids_remove_padding, &seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder,
                    &cu_seqlens_q, &attn_mask_offsets_full, &is_block_step, &decode_states,
                    &attn_mask_offsets});
  // Only the length of ids_remove_padding is used (the token count T), whatever its dtype.
  check.Rank(ids_remove_padding, 1);
  const int64_t token_num = ids_remove_padding.dim(0);
  const int64_t bsz = BatchSize(check, seq_lens_this_time);
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder}) {
    CheckPerItemInt32(check, *t, bsz, seq_lens_this_time);
  }
  CheckShape(check, cu_seqlens_q, DType::kInt32, {bsz + 1},
             "batch size + 1, batch size from `seq_lens_this_time`");
  check.Dtype(attn_mask_offsets_full, DType::kInt32);
  check.Rank(attn_mask_offsets_full, 2);
  check.DimEq(attn_mask_offsets_full, 0, seq_lens_this_time, 0);
  check.Contiguous(attn_mask_offsets_full);
  check.Dtype(is_block_step, DType::kBool);
  check.PerItem(is_block_step, bsz, seq_lens_this_time);
  check.Contiguous(is_block_step);
  check.Dtype(decode_states, DType::kInt32);
  check.Rank(decode_states, 2);
  check.DimEq(decode_states, 0, seq_lens_this_time, 0);
  check.Contiguous(decode_states);
  CheckShape(check, attn_mask_offsets, DType::kInt32, {2 * token_num},
             "2 * `ids_remove_padding`.shape[0]");

  UpdateAttnMaskOffsetsArgs args;
  args.attn_mask_offsets = attn_mask_offsets.ptr<int32_t>();
  args.decode_states = decode_states.ptr<int32_t>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<const int32_t>();
  args.seq_lens_encoder = seq_lens_encoder.ptr<const int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<const int32_t>();
  args.cu_seqlens_q = cu_seqlens_q.ptr<const int32_t>();
  args.attn_mask_offsets_full = attn_mask_offsets_full.ptr<const int32_t>();
  args.is_block_step = is_block_step.ptr<const bool>();
  args.bsz = bsz;
  args.token_num = token_num;
  args.max_model_len = attn_mask_offsets_full.dim(1);
  args.decode_width = decode_states.dim(1);
  Dispatch(
      check, seq_lens_this_time.device, [&] { cpu::UpdateAttnMaskOffsets(args); },
      [&] { return cuda::UpdateAttnMaskOffsets(args, stream); },
      [&](xpu::Context* ctx) { return xpu::update_attn_mask_offsets(ctx, args); });
}

}  // namespace fdmtp
