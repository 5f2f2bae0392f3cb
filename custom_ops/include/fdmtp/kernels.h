// Declarations of the backend kernels, framework-free: argument structs in, no
// framework types. Includers need no CUDA headers.
//
//   fdmtp::cpu::X(args)           runs op X on host memory.
//   fdmtp::cuda::X(args, stream)  launches op X on `stream` (a cudaStream_t, or nullptr for
//                                 the legacy default stream) and returns the cudaError_t
//                                 as an int (0 = success). It never synchronises.
#pragma once

#include "fdmtp/draft_model_postprocess.h"
#include "fdmtp/draft_model_preprocess.h"
#include "fdmtp/draft_model_update.h"
#include "fdmtp/mtp_step_paddle.h"
#include "fdmtp/speculate_pre_process.h"
#include "fdmtp/unified_update_model_status.h"
#include "fdmtp/verify_draft_tokens.h"

namespace fdmtp {

namespace cpu {
void DraftModelPostprocess(const DraftModelPostprocessArgs& args);
void DraftModelPreprocess(const DraftModelPreprocessArgs& args);
void DraftModelUpdate(const DraftModelUpdateArgs& args);
void MtpStepPaddle(const MtpStepArgs& args);
void SpeculatePreProcess(const SpeculatePreProcessArgs& args);
void UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args);
void VerifyDraftTokens(const VerifyDraftTokensArgs& args);
}  // namespace cpu

namespace cuda {
using Stream = void*;  // cudaStream_t

int DraftModelPostprocess(const DraftModelPostprocessArgs& args, Stream stream);
int DraftModelPreprocess(const DraftModelPreprocessArgs& args, Stream stream);
int DraftModelUpdate(const DraftModelUpdateArgs& args, Stream stream);
int MtpStepPaddle(const MtpStepArgs& args, Stream stream);
int SpeculatePreProcess(const SpeculatePreProcessArgs& args, Stream stream);
int UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args, Stream stream);
int VerifyDraftTokens(const VerifyDraftTokensArgs& args, Stream stream);

// Runtime queries, so callers without CUDA headers can report what they see.
int DeviceCount(int* count);      // cudaGetDeviceCount
int Probe(Stream stream);         // launches an empty kernel: tells whether launches work here
const char* ErrorString(int code);  // cudaGetErrorString
const char* ErrorName(int code);    // cudaGetErrorName
}  // namespace cuda

}  // namespace fdmtp
