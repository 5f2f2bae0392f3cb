#include "fdmtp/ops.h"
#include "row_gather_cpu.h"

namespace fdmtp {

FDMTP_DEFINE_ROW_GATHER_CPU_KERNEL(EagleGetHiddenStates, EagleGetHiddenStatesArgs)

// seq_lens_decoder, stop_flags and base_model_seq_lens_encoder are not read (as upstream).
void Prepare(const ArgChecker& check, const EagleGetHiddenStatesCall& call,
             EagleGetHiddenStatesArgs* args) {
  PrepareRowGather(check, call,
                   {&call.seq_lens_this_time, &call.seq_lens_encoder, &call.accept_nums,
                    &call.base_model_seq_lens_this_time},
                   OutRows::kLikeInput, &args->rows);
}

}  // namespace fdmtp
