#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args) {
  bool any_running = false;
  for (int64_t b = 0; b < args.max_bsz; ++b) {
    any_running = UnifiedUpdateModelStatusItem(args, b) || any_running;
  }
  args.has_running_seqs[0] = any_running;
}

}  // namespace cpu
}  // namespace fdmtp
