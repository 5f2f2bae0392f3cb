#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void DraftModelPreprocess(const DraftModelPreprocessArgs& args) {
  bool any_kept = false;
  for (int64_t b = 0; b < args.bsz; ++b) any_kept = DraftModelPreprocessItem(args, b) || any_kept;
  *args.not_need_stop = any_kept;
}

}  // namespace cpu
}  // namespace fdmtp
