// Paddle binding of ngram_match: FastDeploy's inputs, outputs, attrs and in-place map, plus
// two attrs of ours at the end: threshold (upstream read
// INFER_WITH_REFERENCE_TOKENUM_THRESHOLD inside the op; the Python wrapper passes it) and
// num_threads (CPU search threads).
#include "tensor_ref.h"

namespace {

void NgramMatch(const paddle::Tensor& input_ids, const paddle::Tensor& input_ids_len,
                const paddle::Tensor& token_ids_all, const paddle::Tensor& prompt_lens,
                const paddle::Tensor& step_idx, const paddle::Tensor& draft_token_num,
                const paddle::Tensor& draft_tokens, const paddle::Tensor& seq_lens_this_time,
                const paddle::Tensor& seq_lens_encoder, const paddle::Tensor& seq_lens_decoder,
                const paddle::Tensor& max_dec_len, int max_ngram_size, int max_draft_tokens,
                int threshold, int num_threads) {
  namespace pb = fdmtp::paddle_binding;
  pb::RunEntry([&] {
    pb::PaddleScratch scratch(seq_lens_this_time.place());
    fdmtp::NgramMatch(
        FDMTP_REF(input_ids), FDMTP_REF(input_ids_len),
        FDMTP_REF(token_ids_all), FDMTP_REF(prompt_lens),
        FDMTP_REF(step_idx), FDMTP_REF(draft_token_num),
        FDMTP_REF(draft_tokens),
        FDMTP_REF(seq_lens_this_time),
        FDMTP_REF(seq_lens_encoder),
        FDMTP_REF(seq_lens_decoder), FDMTP_REF(max_dec_len),
        max_ngram_size, max_draft_tokens, threshold, num_threads,
        pb::StreamOf(seq_lens_this_time), &scratch);
  });
}

}  // namespace

PD_BUILD_OP(ngram_match)
    .Inputs({"input_ids", "input_ids_len", "token_ids_all", "prompt_lens", "step_idx",
             "draft_token_num", "draft_tokens", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "max_dec_len"})
    .Attrs({"max_ngram_size: int", "max_draft_tokens: int", "threshold: int",
            "num_threads: int"})
    .Outputs({"draft_tokens_out", "seq_lens_this_time_out"})
    .SetInplaceMap({{"draft_tokens", "draft_tokens_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"}})
    .SetKernelFn(PD_KERNEL(NgramMatch));
