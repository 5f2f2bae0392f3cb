#include <cstring>

#include "fdmtp/ops.h"

#include "entry/checks.h"

namespace fdmtp {
namespace cpu {

void UpdateAttnMaskOffsets(const UpdateAttnMaskOffsetsArgs& args) {
  if (args.token_num > 0) {
    std::memset(args.attn_mask_offsets, 0, sizeof(int32_t) * 2 * args.token_num);
  }
  for (int64_t b = 0; b < args.bsz; ++b) UpdateAttnMaskOffsetsItem(args, b);
}

}  // namespace cpu
void Prepare(const ArgChecker& check, const UpdateAttnMaskOffsetsCall& call,
             UpdateAttnMaskOffsetsArgs* args) {
  // Only the length of ids_remove_padding is used (the token count T), whatever its dtype.
  check.Rank(call.ids_remove_padding, 1);
  const int64_t token_num = call.ids_remove_padding.dim(0);
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = BatchSize(check, slt);
  for (const TensorRef* t : {&slt, &call.seq_lens_encoder, &call.seq_lens_decoder}) {
    check.PerItem(*t, bsz, slt);
  }
  CheckShape(check, call.cu_seqlens_q, DType::kInt32, {bsz + 1},
             "batch size + 1, batch size from `seq_lens_this_time`");
  check.Rank(call.attn_mask_offsets_full, 2);
  check.DimEq(call.attn_mask_offsets_full, 0, slt, 0);
  check.PerItem(call.is_block_step, bsz, slt);
  check.Rank(call.decode_states, 2);
  check.DimEq(call.decode_states, 0, slt, 0);
  CheckShape(check, call.attn_mask_offsets, DType::kInt32, {2 * token_num},
             "2 * `ids_remove_padding`.shape[0]");
  args->bsz = bsz;
  args->token_num = token_num;
  args->max_model_len = call.attn_mask_offsets_full.dim(1);
  args->decode_width = call.decode_states.dim(1);
}

}  // namespace fdmtp
