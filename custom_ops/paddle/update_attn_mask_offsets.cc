// Paddle binding of update_attn_mask_offsets (GPU develop signature): the new output
// attn_mask_offsets [2 * T] int32 is allocated here; decode_states is in place.
#include "tensor_ref.h"

namespace {

std::vector<paddle::Tensor> UpdateAttnMaskOffsets(
    const paddle::Tensor& ids_remove_padding, const paddle::Tensor& seq_lens_this_time,
    const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& seq_lens_decoder,
    const paddle::Tensor& cu_seqlens_q, const paddle::Tensor& attn_mask_offsets_full,
    const paddle::Tensor& is_block_step, const paddle::Tensor& decode_states) {
  namespace pb = fdmtp::paddle_binding;
  const int64_t tokens = ids_remove_padding.shape().empty() ? 0 : ids_remove_padding.shape()[0];
  paddle::Tensor attn_mask_offsets =
      paddle::empty({2 * tokens}, paddle::DataType::INT32, seq_lens_this_time.place());
  pb::RunEntry([&] {
    fdmtp::UpdateAttnMaskOffsets(
        FDMTP_REF(ids_remove_padding),
        FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(seq_lens_decoder), FDMTP_REF(cu_seqlens_q),
        FDMTP_REF(attn_mask_offsets_full),
        FDMTP_REF(is_block_step), FDMTP_REF(decode_states),
        FDMTP_REF(attn_mask_offsets), pb::StreamOf(seq_lens_this_time));
  });
  return {attn_mask_offsets};
}

std::vector<std::vector<int64_t>> UpdateAttnMaskOffsetsShape(
    const std::vector<int64_t>& ids_remove_padding, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>& decode_states) {
  const int64_t tokens = ids_remove_padding.empty() || ids_remove_padding[0] < 0
                             ? -1
                             : 2 * ids_remove_padding[0];
  return {{tokens}, decode_states};
}

std::vector<paddle::DataType> UpdateAttnMaskOffsetsDtype(
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType& decode_states) {
  return {paddle::DataType::INT32, decode_states};
}

}  // namespace

PD_BUILD_OP(update_attn_mask_offsets)
    .Inputs({"ids_remove_padding", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
             "cu_seqlens_q", "attn_mask_offsets_full", "is_block_step", "decode_states"})
    .Outputs({"attn_mask_offsets", "decode_states_out"})
    .SetInplaceMap({{"decode_states", "decode_states_out"}})
    .SetKernelFn(PD_KERNEL(UpdateAttnMaskOffsets))
    .SetInferShapeFn(PD_INFER_SHAPE(UpdateAttnMaskOffsetsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(UpdateAttnMaskOffsetsDtype));
