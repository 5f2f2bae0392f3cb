#include <cstring>

#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void UpdateAttnMaskOffsets(const UpdateAttnMaskOffsetsArgs& args) {
  if (args.token_num > 0) {
    std::memset(args.attn_mask_offsets, 0, sizeof(int32_t) * 2 * args.token_num);
  }
  for (int64_t b = 0; b < args.bsz; ++b) UpdateAttnMaskOffsetsItem(args, b);
}

}  // namespace cpu
}  // namespace fdmtp
