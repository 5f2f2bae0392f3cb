#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {

FDMTP_DEFINE_ROW_GATHER_CPU_KERNEL(EagleGatherHiddenStates, EagleGatherHiddenStatesArgs)

// Only input and seq_lens_this_time are read; the others are legacy inputs (as upstream).
void Prepare(const ArgChecker& check, const EagleGatherHiddenStatesCall& call,
             EagleGatherHiddenStatesArgs* args) {
  PrepareRowGather(check, call, {&call.seq_lens_this_time}, OutRows::kPerItem, &args->rows);
}

}  // namespace fdmtp
