#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void DraftModelPostprocess(const DraftModelPostprocessArgs& args) {
  for (int64_t b = 0; b < args.bsz; ++b) DraftModelPostprocessItem(args, b);
}

}  // namespace cpu
}  // namespace fdmtp
