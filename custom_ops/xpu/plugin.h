// fastdeploy_mtp XPU plugin: one declaration per op, in the layering of FastDeploy's Kunlun
// plugin (custom_ops/xpu_ops/src/plugin). Each function checks its arguments and capacity
// limits (xpu_limits.h), then runs on the context's device: kCpu runs `cpu_wrapper` (the shared
// per-item logic of include/fdmtp/ on host memory), kXpu3 launches the XPU3 kernel of
// kernel/<op>.xpu: on a Kunlun device with the real toolchain (FDMTP_WITH_XPU), or under
// the emulator (emu/kp_emu.h) on host memory in the default build.
//
// Every function returns 0 on success, else an error code; LastError() then holds a
// message naming the op and the violated limit or the failed launch.
#pragma once

#include <string>

#include "fdmtp/kernels.h"
#include "xpu/xpu_limits.h"

namespace fdmtp {
namespace xpu {

enum class DevType { kCpu, kXpu3 };

// What FastDeploy's api::Context carries for these ops: the device kind, the launch shape
// and the XPU stream (XPUStream; nullptr = the default stream).
struct Context {
  DevType dev = DevType::kXpu3;
  int clusters = kDefaultClusters;
  int cores = kDefaultCores;
  void* stream = nullptr;
};

enum Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,  // an argument or capacity check failed
  kLaunchFailed = 2,     // the kernel launch (or the emulated kernel) failed
  kUnimplemented = 3,    // no implementation for this context's device
};

// The message of the last failure on this thread.
const std::string& LastError();

// Host tensors run the XPU3 kernels under the emulator while an EmulationScope is alive on
// this thread (the framework-free module's `xpu_emulation((clusters, cores))`).
class EmulationScope {
 public:
  EmulationScope(int clusters, int cores);
  ~EmulationScope();
  EmulationScope(const EmulationScope&) = delete;
  EmulationScope& operator=(const EmulationScope&) = delete;

 private:
  const Context* previous_;
  Context context_;
};
// The active emulation context of this thread, or nullptr.
const Context* ActiveEmulation();

int draft_model_postprocess(Context* ctx, const DraftModelPostprocessArgs& args);
int draft_model_preprocess(Context* ctx, const DraftModelPreprocessArgs& args);
int draft_model_update(Context* ctx, const DraftModelUpdateArgs& args);
int mtp_step_paddle(Context* ctx, const MtpStepArgs& args);
int speculate_pre_process(Context* ctx, const SpeculatePreProcessArgs& args);
int unified_update_model_status(Context* ctx, const UnifiedUpdateModelStatusArgs& args);
int verify_draft_tokens(Context* ctx, const VerifyDraftTokensArgs& args);
// T: float, Float16 or BFloat16.
template <typename T>
int eagle_get_hidden_states(Context* ctx, const EagleGetHiddenStatesArgs& args);
template <typename T>
int eagle_get_self_hidden_states(Context* ctx, const EagleGetSelfHiddenStatesArgs& args);
template <typename T>
int eagle_gather_hidden_states(Context* ctx, const EagleGatherHiddenStatesArgs& args);
template <typename T>
int speculate_get_logits(Context* ctx, const SpeculateGetLogitsArgs& args);
int update_attn_mask_offsets(Context* ctx, const UpdateAttnMaskOffsetsArgs& args);
int hybrid_mtp_ngram(Context* ctx, const HybridMtpNgramArgs& args);
int ngram_match(Context* ctx, const NgramMatchArgs& args);

// Emulator self-checks (tests only): kernels that break the KP rules on purpose, to show
// the emulator reports them. which: "local_overflow" or "barrier_mismatch".
int emulator_selftest(Context* ctx, const std::string& which);

}  // namespace xpu
}  // namespace fdmtp
