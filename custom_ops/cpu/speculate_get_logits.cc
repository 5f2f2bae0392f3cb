#include <cstring>

#include <string>
#include "fdmtp/ops.h"

#include "entry/checks.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void SpeculateGetLogits(const SpeculateGetLogitsArgs& a) {
  T* draft = static_cast<T*>(a.draft_logits);
  const T* logits = static_cast<const T*>(a.logits);
  const T* first = static_cast<const T*>(a.first_token_logits);
  const size_t row_bytes = static_cast<size_t>(a.vocab) * sizeof(T);
  const int64_t next_limit = SpeculateGetLogitsLimit(a.logit_rows);
  const int64_t batch_limit = SpeculateGetLogitsLimit(a.draft_rows);
  int64_t next_off = 0;  // cu_next_token_offset[0] is taken as 0 (never written)
  int64_t batch_off = 0;
  for (int64_t b = 0; b < a.bsz; ++b) {
    const LogitsCounts c = SpeculateGetLogitsCounts(a, b);
    const int64_t next_end = SpeculateGetLogitsAdvance(next_off, c.next, next_limit);
    const int64_t batch_end = SpeculateGetLogitsAdvance(batch_off, c.batch, batch_limit);
    a.next_token_num[b] = static_cast<int32_t>(next_end - next_off);
    a.batch_token_num[b] = static_cast<int32_t>(batch_end - batch_off);
    for (int64_t dst = batch_off; dst < batch_end; ++dst) {
      const LogitsSource s = SpeculateGetLogitsSource(a, b, dst - batch_off, next_off);
      if (s.row < 0 || row_bytes == 0) continue;
      const T* src = (s.tensor == 1 ? first : logits) + s.row * a.vocab;
      std::memcpy(draft + dst * a.vocab, src, row_bytes);
    }
    next_off = next_end;
    batch_off = batch_end;
    a.cu_next_token_offset[b + 1] = static_cast<int32_t>(next_off);
    a.cu_batch_token_offset[b + 1] = static_cast<int32_t>(batch_off);
  }
}

#define FDMTP_INSTANTIATE(T) template void SpeculateGetLogits<T>(const SpeculateGetLogitsArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
void Prepare(const ArgChecker& check, const SpeculateGetLogitsCall& call,
             SpeculateGetLogitsArgs* args) {
  const TensorRef& slt = call.seq_lens_this_time;
  const int64_t bsz = BatchSize(check, slt);
  check.PerItem({&slt, &call.seq_lens_encoder, &call.next_token_num, &call.batch_token_num}, bsz,
                slt);
  const std::string offsets = "batch size + 1, batch size from `seq_lens_this_time`";
  CheckShape(check, call.cu_next_token_offset, DType::kInt32, {bsz + 1}, offsets);
  CheckShape(check, call.cu_batch_token_offset, DType::kInt32, {bsz + 1}, offsets);
  check.Rank(call.draft_logits, 2);
  const int64_t vocab = call.draft_logits.dim(1);
  check.Rank(call.logits, 2);
  check.DimEq(call.logits, 1, call.draft_logits, 1);
  CheckShape(check, call.first_token_logits, call.draft_logits.dtype, {bsz, vocab},
             "batch size from `seq_lens_this_time`, vocab from `draft_logits`");
  args->bsz = bsz;
  args->vocab = vocab;
  args->draft_rows = call.draft_logits.dim(0);
  args->logit_rows = call.logits.dim(0);
}

}  // namespace fdmtp
