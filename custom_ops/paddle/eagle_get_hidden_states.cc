// Paddle binding of eagle_get_hidden_states: FastDeploy's inputs, attr and outputs (GPU
// develop: `out` [T, H] and `output_token_num` [1] int32, both allocated here).
#include "tensor_ref.h"

namespace {

std::vector<paddle::Tensor> EagleGetHiddenStates(
    const paddle::Tensor& input, const paddle::Tensor& seq_lens_this_time,
    const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& seq_lens_decoder,
    const paddle::Tensor& stop_flags, const paddle::Tensor& accept_nums,
    const paddle::Tensor& base_model_seq_lens_this_time,
    const paddle::Tensor& base_model_seq_lens_encoder, int actual_draft_token_num) {
  namespace pb = fdmtp::paddle_binding;
  paddle::Tensor out = paddle::empty(input.shape(), input.dtype(), input.place());
  paddle::Tensor output_token_num = paddle::empty({1}, paddle::DataType::INT32, input.place());
  pb::RunEntry([&] {
    fdmtp::EagleGetHiddenStates(
        FDMTP_REF(input), FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(seq_lens_decoder), FDMTP_REF(stop_flags),
        FDMTP_REF(accept_nums),
        FDMTP_REF(base_model_seq_lens_this_time),
        FDMTP_REF(base_model_seq_lens_encoder),
        actual_draft_token_num, FDMTP_REF(out),
        FDMTP_REF(output_token_num), pb::StreamOf(input));
  });
  return {out, output_token_num};
}

std::vector<std::vector<int64_t>> EagleGetHiddenStatesShape(
    const std::vector<int64_t>& input, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {input, {1}};
}

std::vector<paddle::DataType> EagleGetHiddenStatesDtype(
    const paddle::DataType& input, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {input, paddle::DataType::INT32};
}

}  // namespace

PD_BUILD_OP(eagle_get_hidden_states)
    .Inputs({"input", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "stop_flags",
             "accept_nums", "base_model_seq_lens_this_time", "base_model_seq_lens_encoder"})
    .Attrs({"actual_draft_token_num: int"})
    .Outputs({"out", "output_token_num"})
    .SetKernelFn(PD_KERNEL(EagleGetHiddenStates))
    .SetInferShapeFn(PD_INFER_SHAPE(EagleGetHiddenStatesShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(EagleGetHiddenStatesDtype));
