// Device scratch for op entries called from the framework-free module: stream-ordered
// cudaMallocAsync on the op's stream, released with cudaFreeAsync on the same stream when
// the call returns (the kernels queued before the release still see the memory). No host
// synchronisation.
#pragma once

#include <string>
#include <vector>

#include "fdmtp/kernels.h"
#include "fdmtp/ops.h"

namespace fdmtp {
namespace pybind {

class StreamScratch : public ScratchAllocator {
 public:
  explicit StreamScratch(void* stream) : stream_(stream) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() override {
#if defined(FDMTP_WITH_CUDA)
    for (void* p : held_) cuda::FreeAsync(p, stream_);
#endif
  }

  void* Allocate(size_t bytes) override {
#if defined(FDMTP_WITH_CUDA)
    void* p = nullptr;
    const int status = cuda::MallocAsync(&p, bytes, stream_);
    if (status != 0) {
      throw Error(std::string("cudaMallocAsync of the op's scratch failed: ") +
                  cuda::ErrorName(status) + ": " + cuda::ErrorString(status));
    }
    held_.push_back(p);
    return p;
#else
    (void)bytes;
    return nullptr;
#endif
  }

 private:
  void* stream_;
  std::vector<void*> held_;
};

}  // namespace pybind
}  // namespace fdmtp
