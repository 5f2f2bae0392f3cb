#include "ngram_cuda.cuh"

namespace fdmtp {
namespace cuda {

int HybridMtpNgram(const HybridMtpNgramArgs& args, void* workspace, Stream stream) {
  return ngram::LaunchAll<HybridMtpNgramOp>(args, args.bsz, args.max_ngram_size,
                                            args.min_ngram_size, args.threshold, workspace, stream);
}

}  // namespace cuda
}  // namespace fdmtp
