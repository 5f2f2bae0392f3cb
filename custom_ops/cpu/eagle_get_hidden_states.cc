#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void EagleGetHiddenStates(const EagleGetHiddenStatesArgs& args) {
  GatherRows<T>(args);
}

#define FDMTP_INSTANTIATE(T) template void EagleGetHiddenStates<T>(const EagleGetHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
// seq_lens_decoder, stop_flags and base_model_seq_lens_encoder are not read (as upstream).
void Prepare(const ArgChecker& check, const EagleGetHiddenStatesCall& call,
             EagleGetHiddenStatesArgs* args) {
  const int64_t bsz = BatchSize(check, call.seq_lens_this_time);
  for (const TensorRef* t : {&call.seq_lens_this_time, &call.seq_lens_encoder, &call.accept_nums,
                             &call.base_model_seq_lens_this_time}) {
    check.PerItem(*t, bsz, call.seq_lens_this_time);
  }
  const int64_t rows = call.input.shape.size() == 2 ? call.input.dim(0) : 0;
  CheckRowGather(check, call.input, call.out, call.output_token_num, rows, bsz, "`input`.shape[0]",
                 &args->rows);
}

}  // namespace fdmtp
