// fastdeploy_mtp._kernels: the ops without Paddle. Tensors are DLPack objects or raw
// pointer tuples (see tensor_arg.h); CUDA work is launched on `stream` (an integer
// cudaStream_t, 0 = legacy default stream) and is not synchronised.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "fdmtp/kernels.h"
#include "fdmtp/ops.h"
#include "ipc.h"
#include "scratch.h"
#include "tensor_arg.h"
#include "xpu/plugin.h"

namespace py = pybind11;

namespace {

// Tensors become TensorRefs named after the parameter (= the op's input name).
#define FDMTP_ARG(obj) args.Convert(obj, #obj)
#define FDMTP_OPT_ARG(obj) args.ConvertOptional(obj, #obj)

void* AsStream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

py::dict BuildInfo() {
  py::dict info;
  info["cuda"] = fdmtp::BuiltWithCuda();
  info["xpu"] = fdmtp::BuiltWithXpu();
  // The XPU3 kernels under the emulator (host tensors, see xpu_emulation).
  info["xpu_emulator"] = !fdmtp::BuiltWithXpu();
#if defined(FDMTP_CUDA_ARCHS_STRING)
  info["cuda_archs"] = FDMTP_CUDA_ARCHS_STRING;
#else
  info["cuda_archs"] = "";
#endif
  return info;
}

// (usable, reason): whether CUDA kernels can be launched in this process.
py::tuple CudaStatus() {
#if defined(FDMTP_WITH_CUDA)
  int count = 0;
  int status = fdmtp::cuda::DeviceCount(&count);
  if (status != 0) {
    return py::make_tuple(false, std::string("no usable CUDA device: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  if (count == 0) return py::make_tuple(false, std::string("no CUDA device found"));
  status = fdmtp::cuda::Probe(nullptr);
  if (status != 0) {
    return py::make_tuple(false, std::string("a test kernel launch failed: ") +
                                     fdmtp::cuda::ErrorName(status) + ": " +
                                     fdmtp::cuda::ErrorString(status));
  }
  return py::make_tuple(true, std::to_string(count) + " CUDA device(s)");
#else
  return py::make_tuple(false, std::string("fastdeploy_mtp was built without CUDA kernels"));
#endif
}

void DraftModelPostprocess(py::handle base_model_draft_tokens,
                           py::handle base_model_seq_lens_this_time,
                           py::handle base_model_seq_lens_encoder, py::handle base_model_stop_flags,
                           uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::DraftModelPostprocess(
      FDMTP_ARG(base_model_draft_tokens),
      FDMTP_ARG(base_model_seq_lens_this_time),
      FDMTP_ARG(base_model_seq_lens_encoder),
      FDMTP_ARG(base_model_stop_flags), AsStream(stream));
}


void DraftModelPreprocess(py::handle draft_tokens, py::handle input_ids, py::handle stop_flags,
                          py::handle seq_lens_this_time, py::handle seq_lens_encoder,
                          py::handle seq_lens_decoder, py::handle step_idx,
                          py::handle not_need_stop, py::handle pre_ids, py::handle accept_tokens,
                          py::handle accept_num, py::handle target_model_seq_lens_encoder,
                          py::handle target_model_seq_lens_decoder,
                          py::handle target_model_step_idx, py::handle target_model_stop_flags,
                          py::handle max_dec_len, py::handle target_model_draft_tokens,
                          int num_model_step, bool is_splitwise_prefill, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::DraftModelPreprocess(
      FDMTP_ARG(draft_tokens), FDMTP_ARG(input_ids), FDMTP_ARG(stop_flags),
      FDMTP_ARG(seq_lens_this_time), FDMTP_ARG(seq_lens_encoder), FDMTP_ARG(seq_lens_decoder),
      FDMTP_ARG(step_idx), FDMTP_ARG(not_need_stop), FDMTP_ARG(pre_ids), FDMTP_ARG(accept_tokens),
      FDMTP_ARG(accept_num), FDMTP_ARG(target_model_seq_lens_encoder),
      FDMTP_ARG(target_model_seq_lens_decoder), FDMTP_ARG(target_model_step_idx),
      FDMTP_ARG(target_model_stop_flags), FDMTP_ARG(max_dec_len),
      FDMTP_ARG(target_model_draft_tokens), num_model_step, is_splitwise_prefill,
      AsStream(stream));
}

void DraftModelUpdate(py::handle inter_next_tokens, py::handle draft_tokens, py::handle pre_ids,
                      py::handle seq_lens_this_time, py::handle seq_lens_encoder,
                      py::handle seq_lens_decoder, py::handle step_idx,
                      py::handle cu_seqlens_q_output, py::handle stop_flags,
                      py::handle not_need_stop, py::handle max_dec_len, py::handle end_ids,
                      py::handle base_model_draft_tokens, int max_seq_len, int substep,
                      uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::DraftModelUpdate(
      FDMTP_ARG(inter_next_tokens), FDMTP_ARG(draft_tokens), FDMTP_ARG(pre_ids),
      FDMTP_ARG(seq_lens_this_time), FDMTP_ARG(seq_lens_encoder), FDMTP_ARG(seq_lens_decoder),
      FDMTP_ARG(step_idx), FDMTP_ARG(cu_seqlens_q_output), FDMTP_ARG(stop_flags),
      FDMTP_ARG(not_need_stop), FDMTP_ARG(max_dec_len), FDMTP_ARG(end_ids),
      FDMTP_ARG(base_model_draft_tokens), max_seq_len, substep, AsStream(stream));
}

void MtpStepPaddle(py::handle base_model_stop_flags, py::handle stop_flags, py::handle batch_drop,
                   py::handle seq_lens_this_time, py::handle seq_lens_encoder,
                   py::handle seq_lens_decoder, py::handle block_tables,
                   py::handle encoder_block_lens, py::handle used_list_len, py::handle free_list,
                   py::handle free_list_len, int block_size, int max_draft_tokens,
                   uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::MtpStepPaddle(FDMTP_ARG(base_model_stop_flags), FDMTP_ARG(stop_flags),
                       FDMTP_ARG(batch_drop), FDMTP_ARG(seq_lens_this_time),
                       FDMTP_ARG(seq_lens_encoder), FDMTP_ARG(seq_lens_decoder),
                       FDMTP_ARG(block_tables), FDMTP_ARG(encoder_block_lens),
                       FDMTP_ARG(used_list_len), FDMTP_ARG(free_list), FDMTP_ARG(free_list_len),
                       block_size, max_draft_tokens, AsStream(stream));
}

void SpeculatePreProcess(py::handle input_ids, py::handle seq_len, py::handle draft_tokens,
                         py::handle seq_lens_encoder, py::handle seq_lens_decoder,
                         int64_t cpu_token_num, py::handle ids_remove_padding,
                         py::handle batch_id_per_token, py::handle cu_seqlens_q,
                         py::handle cu_seqlens_k, py::handle cu_seq_lens_q_output,
                         py::handle batch_id_per_token_output, py::handle real_output_token_num,
                         uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::SpeculatePreProcess(
      FDMTP_ARG(input_ids), FDMTP_ARG(seq_len), FDMTP_ARG(draft_tokens),
      FDMTP_ARG(seq_lens_encoder), FDMTP_ARG(seq_lens_decoder), FDMTP_ARG(ids_remove_padding),
      FDMTP_ARG(batch_id_per_token), FDMTP_ARG(cu_seqlens_q), FDMTP_ARG(cu_seqlens_k),
      FDMTP_ARG(cu_seq_lens_q_output), FDMTP_ARG(batch_id_per_token_output),
      FDMTP_ARG(real_output_token_num), cpu_token_num, AsStream(stream));
}

void UnifiedUpdateModelStatus(py::handle seq_lens_encoder, py::handle seq_lens_decoder,
                              py::handle has_running_seqs, py::handle step_input_ids,
                              py::handle step_output_ids, py::handle step_output_len,
                              py::handle stop_flags, py::handle seq_lens_this_time,
                              py::handle is_paused, py::handle token_ids_all,
                              py::handle prompt_lens, py::handle step_idx, py::handle end_tokens,
                              py::handle max_dec_len, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::UnifiedUpdateModelStatus(
      FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(seq_lens_decoder),
      FDMTP_ARG(has_running_seqs),
      FDMTP_ARG(step_input_ids),
      FDMTP_ARG(step_output_ids),
      FDMTP_ARG(step_output_len), FDMTP_ARG(stop_flags),
      FDMTP_ARG(seq_lens_this_time), FDMTP_ARG(is_paused),
      FDMTP_ARG(token_ids_all), FDMTP_ARG(prompt_lens),
      FDMTP_ARG(step_idx), FDMTP_ARG(end_tokens),
      FDMTP_ARG(max_dec_len), AsStream(stream));
}

void VerifyDraftTokens(py::handle step_output_ids, py::handle step_output_len,
                       py::handle step_input_ids, py::handle target_tokens,
                       py::handle candidate_ids, py::handle candidate_scores,
                       py::handle candidate_lens, py::handle topp, py::handle stop_flags,
                       py::handle seq_lens_encoder, py::handle seq_lens_this_time,
                       py::handle end_tokens, py::handle is_block_step,
                       py::handle cu_seqlens_q_output, py::handle reasoning_status,
                       py::handle max_dec_len, py::handle step_idx, py::handle verify_uniforms,
                       int max_seq_len, int verify_window, int verify_strategy, bool reject_all,
                       bool accept_all, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::VerifyDraftTokens(
      FDMTP_ARG(step_output_ids),
      FDMTP_ARG(step_output_len),
      FDMTP_ARG(step_input_ids),
      FDMTP_OPT_ARG(target_tokens),
      FDMTP_OPT_ARG(candidate_ids),
      FDMTP_OPT_ARG(candidate_scores),
      FDMTP_OPT_ARG(candidate_lens), FDMTP_ARG(topp),
      FDMTP_ARG(stop_flags), FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(end_tokens), FDMTP_ARG(is_block_step),
      FDMTP_ARG(cu_seqlens_q_output),
      FDMTP_ARG(reasoning_status), FDMTP_ARG(max_dec_len),
      FDMTP_ARG(step_idx), FDMTP_OPT_ARG(verify_uniforms),
      max_seq_len, verify_window, verify_strategy, reject_all, accept_all, AsStream(stream));
}

// Ops that allocate outputs in Paddle take them here as keyword-only, caller-owned
// buffers (the module never allocates device memory); every element is written.
void EagleGetHiddenStates(py::handle input, py::handle seq_lens_this_time,
                          py::handle seq_lens_encoder, py::handle seq_lens_decoder,
                          py::handle stop_flags, py::handle accept_nums,
                          py::handle base_model_seq_lens_this_time,
                          py::handle base_model_seq_lens_encoder, int64_t actual_draft_token_num,
                          py::handle out, py::handle output_token_num, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::EagleGetHiddenStates(
      FDMTP_ARG(input), FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(seq_lens_decoder), FDMTP_ARG(stop_flags),
      FDMTP_ARG(accept_nums),
      FDMTP_ARG(base_model_seq_lens_this_time),
      FDMTP_ARG(base_model_seq_lens_encoder),
      actual_draft_token_num, FDMTP_ARG(out),
      FDMTP_ARG(output_token_num), AsStream(stream));
}

void EagleGetSelfHiddenStates(py::handle input, py::handle last_seq_lens_this_time,
                              py::handle seq_lens_this_time, py::handle seq_lens_encoder,
                              py::handle out, py::handle output_token_num, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::EagleGetSelfHiddenStates(
      FDMTP_ARG(input), FDMTP_ARG(last_seq_lens_this_time),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_encoder), FDMTP_ARG(out),
      FDMTP_ARG(output_token_num), AsStream(stream));
}

void EagleGatherHiddenStates(py::handle input, py::handle cu_seqlens_q,
                             py::handle seq_lens_this_time, py::handle seq_lens_decoder,
                             py::handle seq_lens_encoder, py::handle batch_id_per_token_output,
                             py::handle cu_seqlens_q_output, py::handle real_output_token_num,
                             py::handle out, py::handle output_token_num, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::EagleGatherHiddenStates(
      FDMTP_ARG(input), FDMTP_ARG(cu_seqlens_q),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_decoder),
      FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(batch_id_per_token_output),
      FDMTP_ARG(cu_seqlens_q_output),
      FDMTP_ARG(real_output_token_num), FDMTP_ARG(out),
      FDMTP_ARG(output_token_num), AsStream(stream));
}

void SpeculateGetLogits(py::handle draft_logits, py::handle next_token_num,
                        py::handle batch_token_num, py::handle cu_next_token_offset,
                        py::handle cu_batch_token_offset, py::handle logits,
                        py::handle first_token_logits, py::handle seq_lens_this_time,
                        py::handle seq_lens_encoder, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::SpeculateGetLogits(
      FDMTP_ARG(draft_logits), FDMTP_ARG(next_token_num),
      FDMTP_ARG(batch_token_num),
      FDMTP_ARG(cu_next_token_offset),
      FDMTP_ARG(cu_batch_token_offset), FDMTP_ARG(logits),
      FDMTP_ARG(first_token_logits),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_encoder), AsStream(stream));
}

void UpdateAttnMaskOffsets(py::handle ids_remove_padding, py::handle seq_lens_this_time,
                           py::handle seq_lens_encoder, py::handle seq_lens_decoder,
                           py::handle cu_seqlens_q, py::handle attn_mask_offsets_full,
                           py::handle is_block_step, py::handle decode_states,
                           py::handle attn_mask_offsets, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::UpdateAttnMaskOffsets(
      FDMTP_ARG(ids_remove_padding),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(seq_lens_decoder), FDMTP_ARG(cu_seqlens_q),
      FDMTP_ARG(attn_mask_offsets_full),
      FDMTP_ARG(is_block_step), FDMTP_ARG(decode_states),
      FDMTP_ARG(attn_mask_offsets), AsStream(stream));
}

void HybridMtpNgram(py::handle input_ids, py::handle input_ids_len, py::handle pre_ids,
                    py::handle step_idx, py::handle draft_token_num, py::handle draft_tokens,
                    py::handle seq_lens_this_time, py::handle seq_lens_decoder,
                    py::handle max_dec_len, int max_ngram_size, int min_ngram_size,
                    int max_draft_tokens, int threshold, int num_threads, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::pybind::StreamScratch scratch(AsStream(stream));
  fdmtp::HybridMtpNgram(
      FDMTP_ARG(input_ids), FDMTP_ARG(input_ids_len),
      FDMTP_ARG(pre_ids), FDMTP_ARG(step_idx),
      FDMTP_ARG(draft_token_num), FDMTP_ARG(draft_tokens),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_decoder), FDMTP_ARG(max_dec_len),
      max_ngram_size, min_ngram_size, max_draft_tokens, threshold, num_threads, AsStream(stream),
      &scratch);
}

void NgramMatch(py::handle input_ids, py::handle input_ids_len, py::handle token_ids_all,
                py::handle prompt_lens, py::handle step_idx, py::handle draft_token_num,
                py::handle draft_tokens, py::handle seq_lens_this_time,
                py::handle seq_lens_encoder, py::handle seq_lens_decoder, py::handle max_dec_len,
                int max_ngram_size, int max_draft_tokens, int threshold, int num_threads,
                uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::pybind::StreamScratch scratch(AsStream(stream));
  fdmtp::NgramMatch(
      FDMTP_ARG(input_ids), FDMTP_ARG(input_ids_len),
      FDMTP_ARG(token_ids_all), FDMTP_ARG(prompt_lens),
      FDMTP_ARG(step_idx), FDMTP_ARG(draft_token_num),
      FDMTP_ARG(draft_tokens),
      FDMTP_ARG(seq_lens_this_time),
      FDMTP_ARG(seq_lens_encoder),
      FDMTP_ARG(seq_lens_decoder), FDMTP_ARG(max_dec_len),
      max_ngram_size, max_draft_tokens, threshold, num_threads, AsStream(stream), &scratch);
}

// `with _kernels.xpu_emulation(clusters, cores):` runs every op called on host tensors on
// this thread through its XPU3 kernel under the emulator, launched <<<clusters, cores>>>.
class XpuEmulation {
 public:
  XpuEmulation(int clusters, int cores) : clusters_(clusters), cores_(cores) {}
  XpuEmulation& Enter() {
    if (scope_) throw fdmtp::Error("xpu_emulation: this scope is already active");
    scope_ = std::make_unique<fdmtp::xpu::EmulationScope>(clusters_, cores_);
    return *this;
  }
  void Exit(py::handle, py::handle, py::handle) { scope_.reset(); }

 private:
  int clusters_;
  int cores_;
  std::unique_ptr<fdmtp::xpu::EmulationScope> scope_;
};

// Runs one of the emulator's rule-breaking kernels (tests only); raises KernelError with
// the emulator's report.
void XpuEmulatorSelftest(const std::string& which, int clusters, int cores) {
  fdmtp::xpu::Context ctx;
  ctx.clusters = clusters;
  ctx.cores = cores;
  if (fdmtp::xpu::emulator_selftest(&ctx, which) != fdmtp::xpu::kSuccess) {
    throw fdmtp::Error(fdmtp::xpu::LastError());
  }
}

}  // namespace

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "fastdeploy_mtp kernels without Paddle: DLPack or raw-pointer tensors in, in place.";
  // Argument and launch errors: ValueError, with the op and argument named in the message.
  py::register_exception<fdmtp::Error>(m, "KernelError", PyExc_ValueError);
  m.def("build_info", &BuildInfo, "Backends compiled into this module: {cuda, xpu, cuda_archs}.");
  m.def("cuda_status", &CudaStatus,
        "(usable: bool, reason: str): whether CUDA kernels can run in this process.");
  py::class_<XpuEmulation>(m, "xpu_emulation",
                           "Context manager: ops on host tensors run their XPU3 kernels under "
                           "the emulator, launched with <<<clusters, cores>>> (this thread only).")
      .def(py::init<int, int>(), py::arg("clusters"), py::arg("cores"))
      .def("__enter__", &XpuEmulation::Enter, py::return_value_policy::reference)
      .def("__exit__", &XpuEmulation::Exit);
  m.def("_xpu_emulator_selftest", &XpuEmulatorSelftest, py::arg("which"), py::arg("clusters"),
        py::arg("cores"), "Tests only: run a KP-rule-breaking kernel under the emulator.");
  m.def("draft_model_postprocess", &DraftModelPostprocess, py::arg("base_model_draft_tokens"),
        py::arg("base_model_seq_lens_this_time"), py::arg("base_model_seq_lens_encoder"),
        py::arg("base_model_stop_flags"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.draft_model_postprocess.");
  m.def("draft_model_preprocess", &DraftModelPreprocess, py::arg("draft_tokens"),
        py::arg("input_ids"), py::arg("stop_flags"), py::arg("seq_lens_this_time"),
        py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("step_idx"),
        py::arg("not_need_stop"), py::arg("pre_ids"), py::arg("accept_tokens"),
        py::arg("accept_num"), py::arg("target_model_seq_lens_encoder"),
        py::arg("target_model_seq_lens_decoder"), py::arg("target_model_step_idx"),
        py::arg("target_model_stop_flags"), py::arg("max_dec_len"),
        py::arg("target_model_draft_tokens"), py::arg("num_model_step"),
        py::arg("is_splitwise_prefill"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.draft_model_preprocess.");
  m.def("draft_model_update", &DraftModelUpdate, py::arg("inter_next_tokens"),
        py::arg("draft_tokens"), py::arg("pre_ids"), py::arg("seq_lens_this_time"),
        py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("step_idx"),
        py::arg("cu_seqlens_q_output"), py::arg("stop_flags"), py::arg("not_need_stop"),
        py::arg("max_dec_len"), py::arg("end_ids"), py::arg("base_model_draft_tokens"),
        py::arg("max_seq_len"), py::arg("substep"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.draft_model_update.");
  m.def("mtp_step_paddle", &MtpStepPaddle, py::arg("base_model_stop_flags"),
        py::arg("stop_flags"), py::arg("batch_drop"), py::arg("seq_lens_this_time"),
        py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("block_tables"),
        py::arg("encoder_block_lens"), py::arg("used_list_len"), py::arg("free_list"),
        py::arg("free_list_len"), py::arg("block_size"), py::arg("max_draft_tokens"),
        py::kw_only(), py::arg("stream") = 0, "See fastdeploy_mtp.ops.mtp_step_paddle.");
  m.def("speculate_pre_process", &SpeculatePreProcess, py::arg("input_ids"), py::arg("seq_len"),
        py::arg("draft_tokens"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
        py::arg("cpu_token_num"), py::kw_only(), py::arg("ids_remove_padding"),
        py::arg("batch_id_per_token"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
        py::arg("cu_seq_lens_q_output"), py::arg("batch_id_per_token_output"),
        py::arg("real_output_token_num"), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.speculate_pre_process. The seven outputs are caller-allocated "
        "keyword buffers (shapes: [T], [T], [bsz+1] x3, [bsz*W], [1]); every slot is written.");
  m.def("unified_update_model_status", &UnifiedUpdateModelStatus, py::arg("seq_lens_encoder"),
        py::arg("seq_lens_decoder"), py::arg("has_running_seqs"), py::arg("step_input_ids"),
        py::arg("step_output_ids"), py::arg("step_output_len"), py::arg("stop_flags"),
        py::arg("seq_lens_this_time"), py::arg("is_paused"), py::arg("token_ids_all"),
        py::arg("prompt_lens"), py::arg("step_idx"), py::arg("end_tokens"),
        py::arg("max_dec_len"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.unified_update_model_status.");
  // Optional tensors accept None; attrs follow the tensors positionally, as in Paddle.
  m.def("verify_draft_tokens", &VerifyDraftTokens, py::arg("step_output_ids"),
        py::arg("step_output_len"), py::arg("step_input_ids"), py::arg("target_tokens").none(true),
        py::arg("candidate_ids").none(true), py::arg("candidate_scores").none(true),
        py::arg("candidate_lens").none(true), py::arg("topp"), py::arg("stop_flags"),
        py::arg("seq_lens_encoder"), py::arg("seq_lens_this_time"), py::arg("end_tokens"),
        py::arg("is_block_step"), py::arg("cu_seqlens_q_output"), py::arg("reasoning_status"),
        py::arg("max_dec_len"), py::arg("step_idx"), py::arg("verify_uniforms").none(true),
        py::arg("max_seq_len"), py::arg("verify_window"), py::arg("verify_strategy"),
        py::arg("reject_all"), py::arg("accept_all"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.verify_draft_tokens.");
  m.def("eagle_get_hidden_states", &EagleGetHiddenStates, py::arg("input"),
        py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
        py::arg("stop_flags"), py::arg("accept_nums"), py::arg("base_model_seq_lens_this_time"),
        py::arg("base_model_seq_lens_encoder"), py::arg("actual_draft_token_num"), py::kw_only(),
        py::arg("out"), py::arg("output_token_num"), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.eagle_get_hidden_states; `out` [T, H] and `output_token_num` "
        "[1] int32 are caller-allocated outputs.");
  m.def("eagle_get_self_hidden_states", &EagleGetSelfHiddenStates, py::arg("input"),
        py::arg("last_seq_lens_this_time"), py::arg("seq_lens_this_time"),
        py::arg("seq_lens_encoder"), py::kw_only(), py::arg("out"), py::arg("output_token_num"),
        py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.eagle_get_self_hidden_states; `out` [T, H] and "
        "`output_token_num` [1] int32 are caller-allocated outputs.");
  m.def("eagle_gather_hidden_states", &EagleGatherHiddenStates, py::arg("input"),
        py::arg("cu_seqlens_q"), py::arg("seq_lens_this_time"), py::arg("seq_lens_decoder"),
        py::arg("seq_lens_encoder"), py::arg("batch_id_per_token_output"),
        py::arg("cu_seqlens_q_output"), py::arg("real_output_token_num"), py::kw_only(),
        py::arg("out"), py::arg("output_token_num"), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.eagle_gather_hidden_states; `out` [bsz, H] and "
        "`output_token_num` [1] int32 are caller-allocated outputs.");
  m.def("speculate_get_logits", &SpeculateGetLogits, py::arg("draft_logits"),
        py::arg("next_token_num"), py::arg("batch_token_num"), py::arg("cu_next_token_offset"),
        py::arg("cu_batch_token_offset"), py::arg("logits"), py::arg("first_token_logits"),
        py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::kw_only(),
        py::arg("stream") = 0, "See fastdeploy_mtp.ops.speculate_get_logits.");
  m.def("update_attn_mask_offsets", &UpdateAttnMaskOffsets, py::arg("ids_remove_padding"),
        py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
        py::arg("cu_seqlens_q"), py::arg("attn_mask_offsets_full"), py::arg("is_block_step"),
        py::arg("decode_states"), py::kw_only(), py::arg("attn_mask_offsets"),
        py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.update_attn_mask_offsets; `attn_mask_offsets` [2 * T] int32 is "
        "a caller-allocated output.");
  m.def("hybrid_mtp_ngram", &HybridMtpNgram, py::arg("input_ids"), py::arg("input_ids_len"),
        py::arg("pre_ids"), py::arg("step_idx"), py::arg("draft_token_num"),
        py::arg("draft_tokens"), py::arg("seq_lens_this_time"), py::arg("seq_lens_decoder"),
        py::arg("max_dec_len"), py::arg("max_ngram_size"), py::arg("min_ngram_size"),
        py::arg("max_draft_tokens"), py::arg("threshold") = 1024, py::arg("num_threads") = 0,
        py::kw_only(), py::arg("stream") = 0, "See fastdeploy_mtp.ops.hybrid_mtp_ngram.");
  m.def("ngram_match", &NgramMatch, py::arg("input_ids"), py::arg("input_ids_len"),
        py::arg("token_ids_all"), py::arg("prompt_lens"), py::arg("step_idx"),
        py::arg("draft_token_num"), py::arg("draft_tokens"), py::arg("seq_lens_this_time"),
        py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("max_dec_len"),
        py::arg("max_ngram_size"), py::arg("max_draft_tokens"), py::arg("threshold") = 128,
        py::arg("num_threads") = 0, py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.ngram_match.");
  fdmtp::pybind::DefineIpc(m);  // set_data_ipc, share_external_data, unset_data_ipc
}
