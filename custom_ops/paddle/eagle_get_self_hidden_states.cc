// Paddle binding of eagle_get_self_hidden_states (GPU develop signature): `out` [T, H] and
// `output_token_num` [1] int32, allocated here.
#include "tensor_ref.h"

namespace {

std::vector<paddle::Tensor> EagleGetSelfHiddenStates(const paddle::Tensor& input,
                                                     const paddle::Tensor& last_seq_lens_this_time,
                                                     const paddle::Tensor& seq_lens_this_time,
                                                     const paddle::Tensor& seq_lens_encoder) {
  namespace pb = fdmtp::paddle_binding;
  paddle::Tensor out = paddle::empty(input.shape(), input.dtype(), input.place());
  paddle::Tensor output_token_num = paddle::empty({1}, paddle::DataType::INT32, input.place());
  pb::RunEntry([&] {
    fdmtp::EagleGetSelfHiddenStates(
        FDMTP_REF(input), FDMTP_REF(last_seq_lens_this_time),
        FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_encoder), FDMTP_REF(out),
        FDMTP_REF(output_token_num), pb::StreamOf(input));
  });
  return {out, output_token_num};
}

std::vector<std::vector<int64_t>> EagleGetSelfHiddenStatesShape(const std::vector<int64_t>& input,
                                                                const std::vector<int64_t>&,
                                                                const std::vector<int64_t>&,
                                                                const std::vector<int64_t>&) {
  return {input, {1}};
}

std::vector<paddle::DataType> EagleGetSelfHiddenStatesDtype(const paddle::DataType& input,
                                                            const paddle::DataType&,
                                                            const paddle::DataType&,
                                                            const paddle::DataType&) {
  return {input, paddle::DataType::INT32};
}

}  // namespace

PD_BUILD_OP(eagle_get_self_hidden_states)
    .Inputs({"input", "last_seq_lens_this_time", "seq_lens_this_time", "seq_lens_encoder"})
    .Outputs({"out", "output_token_num"})
    .SetKernelFn(PD_KERNEL(EagleGetSelfHiddenStates))
    .SetInferShapeFn(PD_INFER_SHAPE(EagleGetSelfHiddenStatesShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(EagleGetSelfHiddenStatesDtype));
