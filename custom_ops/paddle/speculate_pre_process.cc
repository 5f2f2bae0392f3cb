// Paddle binding of speculate_pre_process: FastDeploy's static-op form (5 inputs, the
// cpu_token_num attr, 7 newly allocated outputs). The Python wrapper keeps the pybind call
// form with cpu_token_num first.
#include "tensor_ref.h"

namespace {

std::vector<paddle::Tensor> SpeculatePreProcess(const paddle::Tensor& input_ids,
                                                const paddle::Tensor& seq_len,
                                                const paddle::Tensor& draft_tokens,
                                                const paddle::Tensor& seq_lens_encoder,
                                                const paddle::Tensor& seq_lens_decoder,
                                                int64_t cpu_token_num) {
  std::vector<paddle::Tensor> outs;
  fdmtp::paddle_binding::RunEntry([&] {
    if (cpu_token_num < 0) {
      throw fdmtp::Error("speculate_pre_process: attr `cpu_token_num` must be >= 0, got " +
                         std::to_string(cpu_token_num));
    }
    const int64_t bsz = seq_len.shape().empty() ? 0 : seq_len.shape()[0];
    const int64_t width = draft_tokens.shape().size() == 2 ? draft_tokens.shape()[1] : 0;
    const paddle::Place place = seq_len.place();
    paddle::Tensor ids_remove_padding = paddle::empty({cpu_token_num}, paddle::DataType::INT64, place);
    paddle::Tensor batch_id_per_token = paddle::empty({cpu_token_num}, paddle::DataType::INT32, place);
    paddle::Tensor cu_seqlens_q = paddle::empty({bsz + 1}, paddle::DataType::INT32, place);
    paddle::Tensor cu_seqlens_k = paddle::empty({bsz + 1}, paddle::DataType::INT32, place);
    paddle::Tensor cu_seq_lens_q_output = paddle::empty({bsz + 1}, paddle::DataType::INT32, place);
    paddle::Tensor batch_id_per_token_output =
        paddle::empty({bsz * width}, paddle::DataType::INT32, place);
    paddle::Tensor real_output_token_num = paddle::empty({1}, paddle::DataType::INT32, place);
    fdmtp::SpeculatePreProcess(
        FDMTP_REF(input_ids), FDMTP_REF(seq_len), FDMTP_REF(draft_tokens),
        FDMTP_REF(seq_lens_encoder), FDMTP_REF(seq_lens_decoder), FDMTP_REF(ids_remove_padding),
        FDMTP_REF(batch_id_per_token), FDMTP_REF(cu_seqlens_q), FDMTP_REF(cu_seqlens_k),
        FDMTP_REF(cu_seq_lens_q_output), FDMTP_REF(batch_id_per_token_output),
        FDMTP_REF(real_output_token_num), cpu_token_num,
        fdmtp::paddle_binding::StreamOf(seq_len));
    outs = {ids_remove_padding, batch_id_per_token,        cu_seqlens_q,         cu_seqlens_k,
            cu_seq_lens_q_output, batch_id_per_token_output, real_output_token_num};
  });
  return outs;
}

std::vector<std::vector<int64_t>> SpeculatePreProcessInferShape(
    const std::vector<int64_t>& input_ids_shape, const std::vector<int64_t>& seq_len_shape,
    const std::vector<int64_t>& draft_tokens_shape, const std::vector<int64_t>&,
    const std::vector<int64_t>&, int64_t cpu_token_num) {
  (void)input_ids_shape;
  const int64_t bsz = seq_len_shape.empty() ? -1 : seq_len_shape[0];
  const int64_t width = draft_tokens_shape.size() == 2 ? draft_tokens_shape[1] : -1;
  const int64_t flat = bsz < 0 || width < 0 ? -1 : bsz * width;
  return {{cpu_token_num}, {cpu_token_num}, {bsz + 1}, {bsz + 1}, {bsz + 1}, {flat}, {1}};
}

std::vector<paddle::DataType> SpeculatePreProcessInferDtype(
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::INT64, paddle::DataType::INT32, paddle::DataType::INT32,
          paddle::DataType::INT32, paddle::DataType::INT32, paddle::DataType::INT32,
          paddle::DataType::INT32};
}

}  // namespace

PD_BUILD_OP(speculate_pre_process)
    .Inputs({"input_ids", "seq_len", "draft_tokens", "seq_lens_encoder", "seq_lens_decoder"})
    .Outputs({"ids_remove_padding", "batch_id_per_token", "cu_seqlens_q", "cu_seqlens_k",
              "cu_seq_lens_q_output", "batch_id_per_token_output", "real_output_token_num"})
    .Attrs({"cpu_token_num: int64_t"})
    .SetKernelFn(PD_KERNEL(SpeculatePreProcess))
    .SetInferShapeFn(PD_INFER_SHAPE(SpeculatePreProcessInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SpeculatePreProcessInferDtype));
