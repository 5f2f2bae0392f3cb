#include "fdmtp/kernels.h"
#include "ngram_common.h"

namespace fdmtp {
namespace cpu {

void HybridMtpNgram(const HybridMtpNgramArgs& args, int num_threads) {
  RunNgram<HybridMtpNgramOp>(args, args.bsz, args.max_ngram_size, args.min_ngram_size,
                             args.threshold, num_threads);
}

}  // namespace cpu
}  // namespace fdmtp
