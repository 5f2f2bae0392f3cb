#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cpu {

void MtpStepPaddle(const MtpStepArgs& args) { MtpStepRun(args); }

}  // namespace cpu
}  // namespace fdmtp
