#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void DraftModelUpdate(const DraftModelUpdateArgs& args) {
  int64_t k = 0;  // compacted index: counted from the input seq_lens_this_time
  bool any_running = false;
  for (int64_t b = 0; b < args.bsz; ++b) {
    const bool active = args.seq_lens_this_time[b] > 0;  // read before the item is updated
    any_running = !DraftModelUpdateItem(args, b, k) || any_running;
    k += active ? 1 : 0;
  }
  *args.not_need_stop = any_running;
}

}  // namespace cpu
}  // namespace fdmtp
