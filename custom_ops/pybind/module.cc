// fastdeploy_mtp._kernels: the ops without Paddle. Tensors are DLPack objects or raw
// pointer tuples (see tensor_arg.h); CUDA work is launched on `stream` (an integer
// cudaStream_t, 0 = legacy default stream) and is not synchronised.
#include <pybind11/pybind11.h>

#include "fdmtp/kernels.h"
#include "fdmtp/ops.h"
#include "tensor_arg.h"

namespace py = pybind11;

namespace {

void* AsStream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

py::dict BuildInfo() {
  py::dict info;
  info["cuda"] = fdmtp::BuiltWithCuda();
  info["xpu"] = fdmtp::BuiltWithXpu();
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
      args.Convert(base_model_draft_tokens, "base_model_draft_tokens"),
      args.Convert(base_model_seq_lens_this_time, "base_model_seq_lens_this_time"),
      args.Convert(base_model_seq_lens_encoder, "base_model_seq_lens_encoder"),
      args.Convert(base_model_stop_flags, "base_model_stop_flags"), AsStream(stream));
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
      args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"),
      args.Convert(has_running_seqs, "has_running_seqs"),
      args.Convert(step_input_ids, "step_input_ids"),
      args.Convert(step_output_ids, "step_output_ids"),
      args.Convert(step_output_len, "step_output_len"), args.Convert(stop_flags, "stop_flags"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"), args.Convert(is_paused, "is_paused"),
      args.Convert(token_ids_all, "token_ids_all"), args.Convert(prompt_lens, "prompt_lens"),
      args.Convert(step_idx, "step_idx"), args.Convert(end_tokens, "end_tokens"),
      args.Convert(max_dec_len, "max_dec_len"), AsStream(stream));
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
      args.Convert(step_output_ids, "step_output_ids"),
      args.Convert(step_output_len, "step_output_len"),
      args.Convert(step_input_ids, "step_input_ids"),
      args.ConvertOptional(target_tokens, "target_tokens"),
      args.ConvertOptional(candidate_ids, "candidate_ids"),
      args.ConvertOptional(candidate_scores, "candidate_scores"),
      args.ConvertOptional(candidate_lens, "candidate_lens"), args.Convert(topp, "topp"),
      args.Convert(stop_flags, "stop_flags"), args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(end_tokens, "end_tokens"), args.Convert(is_block_step, "is_block_step"),
      args.Convert(cu_seqlens_q_output, "cu_seqlens_q_output"),
      args.Convert(reasoning_status, "reasoning_status"), args.Convert(max_dec_len, "max_dec_len"),
      args.Convert(step_idx, "step_idx"), args.ConvertOptional(verify_uniforms, "verify_uniforms"),
      max_seq_len, verify_window, verify_strategy, reject_all, accept_all, AsStream(stream));
}

}  // namespace

PYBIND11_MODULE(_kernels, m) {
  m.doc() = "fastdeploy_mtp kernels without Paddle: DLPack or raw-pointer tensors in, in place.";
  // Argument and launch errors: ValueError, with the op and argument named in the message.
  py::register_exception<fdmtp::Error>(m, "KernelError", PyExc_ValueError);
  m.def("build_info", &BuildInfo, "Backends compiled into this module: {cuda, xpu, cuda_archs}.");
  m.def("cuda_status", &CudaStatus,
        "(usable: bool, reason: str): whether CUDA kernels can run in this process.");
  m.def("draft_model_postprocess", &DraftModelPostprocess, py::arg("base_model_draft_tokens"),
        py::arg("base_model_seq_lens_this_time"), py::arg("base_model_seq_lens_encoder"),
        py::arg("base_model_stop_flags"), py::kw_only(), py::arg("stream") = 0,
        "See fastdeploy_mtp.ops.draft_model_postprocess.");
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
}
