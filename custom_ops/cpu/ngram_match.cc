#include "fdmtp/kernels.h"
#include "ngram_common.h"

namespace fdmtp {
namespace cpu {

void NgramMatch(const NgramMatchArgs& args, int num_threads) {
  RunNgram<NgramMatchOp>(args, args.bsz, args.max_ngram_size, 1, args.threshold, num_threads);
}

}  // namespace cpu
}  // namespace fdmtp
