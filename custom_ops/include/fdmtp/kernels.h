// Declarations of the backend kernels, framework-free: argument structs in, no
// framework types. Includers need no CUDA headers.
//
//   fdmtp::cpu::X(args)           runs op X on host memory.
//   fdmtp::cuda::X(args, stream)  launches op X on `stream` (a cudaStream_t, or nullptr for
//                                 the legacy default stream) and returns the cudaError_t
//                                 as an int (0 = success). It never synchronises.
#pragma once

#include <cstddef>

#include "fdmtp/draft_model_postprocess.h"
#include "fdmtp/draft_model_preprocess.h"
#include "fdmtp/draft_model_update.h"
#include "fdmtp/mtp_step_paddle.h"
#include "fdmtp/speculate_pre_process.h"
#include "fdmtp/unified_update_model_status.h"
#include "fdmtp/verify_draft_tokens.h"
#include "fdmtp/eagle_gather_hidden_states.h"
#include "fdmtp/eagle_get_hidden_states.h"
#include "fdmtp/eagle_get_self_hidden_states.h"
#include "fdmtp/float_types.h"
#include "fdmtp/speculate_get_logits.h"
#include "fdmtp/update_attn_mask_offsets.h"
#include "fdmtp/hybrid_mtp_ngram.h"
#include "fdmtp/ngram_match.h"

namespace fdmtp {

namespace cpu {
void DraftModelPostprocess(const DraftModelPostprocessArgs& args);
void DraftModelPreprocess(const DraftModelPreprocessArgs& args);
void DraftModelUpdate(const DraftModelUpdateArgs& args);
void MtpStepPaddle(const MtpStepArgs& args);
void SpeculatePreProcess(const SpeculatePreProcessArgs& args);
void UnifiedUpdateModelStatus(const UnifiedUpdateModelStatusArgs& args);
void VerifyDraftTokens(const VerifyDraftTokensArgs& args);
// T: float, Float16 or BFloat16 (the element type of the float tensors).
template <typename T>
void EagleGetHiddenStates(const EagleGetHiddenStatesArgs& args);
template <typename T>
void EagleGetSelfHiddenStates(const EagleGetSelfHiddenStatesArgs& args);
template <typename T>
void EagleGatherHiddenStates(const EagleGatherHiddenStatesArgs& args);
template <typename T>
void SpeculateGetLogits(const SpeculateGetLogitsArgs& args);
void UpdateAttnMaskOffsets(const UpdateAttnMaskOffsetsArgs& args);
// num_threads <= 0: chosen from the amount of work; the result never depends on it.
void HybridMtpNgram(const HybridMtpNgramArgs& args, int num_threads);
void NgramMatch(const NgramMatchArgs& args, int num_threads);
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
template <typename T>
int EagleGetHiddenStates(const EagleGetHiddenStatesArgs& args, Stream stream);
template <typename T>
int EagleGetSelfHiddenStates(const EagleGetSelfHiddenStatesArgs& args, Stream stream);
template <typename T>
int EagleGatherHiddenStates(const EagleGatherHiddenStatesArgs& args, Stream stream);
template <typename T>
int SpeculateGetLogits(const SpeculateGetLogitsArgs& args, Stream stream);
int UpdateAttnMaskOffsets(const UpdateAttnMaskOffsetsArgs& args, Stream stream);
// The n-gram ops need NgramWorkspaceBytes(bsz) bytes of device scratch, provided by the
// caller and usable by work on `stream` (the launchers never allocate).
size_t NgramWorkspaceBytes(int64_t bsz);
int HybridMtpNgram(const HybridMtpNgramArgs& args, void* workspace, Stream stream);
int NgramMatch(const NgramMatchArgs& args, void* workspace, Stream stream);

// Runtime queries, so callers without CUDA headers can report what they see.
int DeviceCount(int* count);      // cudaGetDeviceCount
int Probe(Stream stream);         // launches an empty kernel: tells whether launches work here
const char* ErrorString(int code);  // cudaGetErrorString
const char* ErrorName(int code);    // cudaGetErrorName
// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the device's default
// pool): for bindings that provide an op's scratch and have no allocator of their own.
int MallocAsync(void** ptr, size_t bytes, Stream stream);
int FreeAsync(void* ptr, Stream stream);
// CUDA IPC (set_data_ipc / share_external_data; gpu/ipc.cu). `handle` is the 64-byte
// cudaIpcMemHandle_t. GetMemHandle exports the allocation that contains `ptr` and returns
// ptr's byte offset in it; OpenMemHandle maps an exported allocation on `device` (it must
// come from another process) and returns its base; CloseMemHandle unmaps that base.
int IpcGetMemHandle(const void* ptr, void* handle, uint64_t* offset);
int IpcOpenMemHandle(const void* handle, int device, void** base);
int IpcCloseMemHandle(void* base);
}  // namespace cuda

}  // namespace fdmtp
