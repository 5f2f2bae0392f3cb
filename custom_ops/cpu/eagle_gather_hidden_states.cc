#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {
namespace cpu {

template <typename T>
void EagleGatherHiddenStates(const EagleGatherHiddenStatesArgs& args) {
  GatherRows<T>(args);
}

#define FDMTP_INSTANTIATE(T) \
  template void EagleGatherHiddenStates<T>(const EagleGatherHiddenStatesArgs&);
FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)
#undef FDMTP_INSTANTIATE

}  // namespace cpu
// Only input and seq_lens_this_time are read; the others are legacy inputs (as upstream).
void Prepare(const ArgChecker& check, const EagleGatherHiddenStatesCall& call,
             EagleGatherHiddenStatesArgs* args) {
  const int64_t bsz = BatchSize(check, call.seq_lens_this_time);
  check.PerItem(call.seq_lens_this_time, bsz, call.seq_lens_this_time);
  CheckRowGather(check, call.input, call.out, call.output_token_num, bsz, bsz,
                 "`seq_lens_this_time`.shape[0]", &args->rows);
}

}  // namespace fdmtp
