#include "ngram_cuda.cuh"

namespace fdmtp {
namespace cuda {

size_t NgramWorkspaceBytes(int64_t bsz) { return ngram::WorkspaceBytes(bsz); }

int NgramMatch(const NgramMatchArgs& args, void* workspace, Stream stream) {
  return ngram::LaunchAll<NgramMatchOp>(args, args.bsz, args.max_ngram_size, 1, args.threshold,
                                        workspace, stream);
}

}  // namespace cuda
}  // namespace fdmtp
