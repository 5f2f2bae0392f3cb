// Paddle binding of eagle_gather_hidden_states: `out` [bsz, H] (bsz from
// seq_lens_this_time) and `output_token_num` [1] int32, allocated here.
#include "tensor_ref.h"

namespace {

std::vector<paddle::Tensor> EagleGatherHiddenStates(
    const paddle::Tensor& input, const paddle::Tensor& cu_seqlens_q,
    const paddle::Tensor& seq_lens_this_time, const paddle::Tensor& seq_lens_decoder,
    const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& batch_id_per_token_output,
    const paddle::Tensor& cu_seqlens_q_output, const paddle::Tensor& real_output_token_num) {
  namespace pb = fdmtp::paddle_binding;
  const int64_t bsz = seq_lens_this_time.shape().empty() ? 0 : seq_lens_this_time.shape()[0];
  const int64_t hidden = input.shape().size() == 2 ? input.shape()[1] : 0;
  paddle::Tensor out = paddle::empty({bsz, hidden}, input.dtype(), input.place());
  paddle::Tensor output_token_num = paddle::empty({1}, paddle::DataType::INT32, input.place());
  pb::RunEntry([&] {
    fdmtp::EagleGatherHiddenStates(
        FDMTP_REF(input), FDMTP_REF(cu_seqlens_q),
        FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_decoder),
        FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(batch_id_per_token_output),
        FDMTP_REF(cu_seqlens_q_output),
        FDMTP_REF(real_output_token_num), FDMTP_REF(out),
        FDMTP_REF(output_token_num), pb::StreamOf(input));
  });
  return {out, output_token_num};
}

std::vector<std::vector<int64_t>> EagleGatherHiddenStatesShape(
    const std::vector<int64_t>& input, const std::vector<int64_t>&,
    const std::vector<int64_t>& seq_lens_this_time, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&) {
  return {{seq_lens_this_time.empty() ? -1 : seq_lens_this_time[0],
           input.size() == 2 ? input[1] : -1},
          {1}};
}

std::vector<paddle::DataType> EagleGatherHiddenStatesDtype(
    const paddle::DataType& input, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {input, paddle::DataType::INT32};
}

}  // namespace

PD_BUILD_OP(eagle_gather_hidden_states)
    .Inputs({"input", "cu_seqlens_q", "seq_lens_this_time", "seq_lens_decoder", "seq_lens_encoder",
             "batch_id_per_token_output", "cu_seqlens_q_output", "real_output_token_num"})
    .Outputs({"out", "output_token_num"})
    .SetKernelFn(PD_KERNEL(EagleGatherHiddenStates))
    .SetInferShapeFn(PD_INFER_SHAPE(EagleGatherHiddenStatesShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(EagleGatherHiddenStatesDtype));
