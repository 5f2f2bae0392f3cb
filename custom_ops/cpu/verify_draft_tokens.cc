#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void VerifyDraftTokens(const VerifyDraftTokensArgs& args) {
  for (int64_t b = 0; b < args.max_bsz; ++b) VerifyDraftTokensItem(args, b);
}

}  // namespace cpu
}  // namespace fdmtp
