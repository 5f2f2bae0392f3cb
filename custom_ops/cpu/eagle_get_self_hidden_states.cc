#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void EagleGetSelfHiddenStates(const EagleGetSelfHiddenStatesArgs& args) {
  GatherRows<T>(args);
}

#define FDMTP_INSTANTIATE(T) \
  template void EagleGetSelfHiddenStates<T>(const EagleGetSelfHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
void Prepare(const ArgChecker& check, const EagleGetSelfHiddenStatesCall& call,
             EagleGetSelfHiddenStatesArgs* args) {
  const int64_t bsz = BatchSize(check, call.seq_lens_this_time);
  for (const TensorRef* t :
       {&call.last_seq_lens_this_time, &call.seq_lens_this_time, &call.seq_lens_encoder}) {
    check.PerItem(*t, bsz, call.seq_lens_this_time);
  }
  const int64_t rows = call.input.shape.size() == 2 ? call.input.dim(0) : 0;
  CheckRowGather(check, call.input, call.out, call.output_token_num, rows, bsz, "`input`.shape[0]",
                 &args->rows);
}

}  // namespace fdmtp
