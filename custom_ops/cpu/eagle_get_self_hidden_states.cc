#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {

FDMTP_DEFINE_ROW_GATHER_CPU_KERNEL(EagleGetSelfHiddenStates, EagleGetSelfHiddenStatesArgs)

void Prepare(const ArgChecker& check, const EagleGetSelfHiddenStatesCall& call,
             EagleGetSelfHiddenStatesArgs* args) {
  PrepareRowGather(
      check, call,
      {&call.last_seq_lens_this_time, &call.seq_lens_this_time, &call.seq_lens_encoder},
      OutRows::kLikeInput, &args->rows);
}

}  // namespace fdmtp
