#include <cstring>
#include <string>

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
  check.PerItem({&slt, &call.seq_lens_encoder, &call.seq_lens_decoder}, bsz, slt);
  // cu_seqlens_q: entry b is the first token of item b and only entries 0..N-1 are read, so
  // upstream's exclusive [N] form, the usual [N + 1] and arrays padded past the batch are
  // all accepted.
  check.Dtype(call.cu_seqlens_q, DType::kInt32);
  if (call.cu_seqlens_q.shape.size() != 1 || call.cu_seqlens_q.dim(0) < bsz) {
    check.Fail("`cu_seqlens_q` must have shape [m] with m >= " + std::to_string(bsz) +
               " (N, or N + 1; batch size from `seq_lens_this_time`), got " +
               call.cu_seqlens_q.ShapeString());
  }
  check.Contiguous(call.cu_seqlens_q);
  check.Rows(call.attn_mask_offsets_full, bsz, slt);
  check.PerItem(call.is_block_step, bsz, slt);
  check.Rows(call.decode_states, bsz, slt);
  CheckShape(check, call.attn_mask_offsets, DType::kInt32, {2 * token_num},
             "2 * `ids_remove_padding`.shape[0]");
  args->bsz = bsz;
  args->token_num = token_num;
  args->max_model_len = call.attn_mask_offsets_full.dim(1);
  args->decode_width = call.decode_states.dim(1);
}

}  // namespace fdmtp
