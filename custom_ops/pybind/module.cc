// fastdeploy_mtp._kernels: the ops without Paddle. Tensors are DLPack objects or raw
// pointer tuples (see tensor_arg.h); CUDA work is launched on `stream` (an integer
// cudaStream_t, 0 = legacy default stream) and is not synchronised.
#include <pybind11/pybind11.h>

#include "fdmtp/kernels.h"
#include "fdmtp/ops.h"
#include "scratch.h"
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

void HybridMtpNgram(py::handle input_ids, py::handle input_ids_len, py::handle pre_ids,
                    py::handle step_idx, py::handle draft_token_num, py::handle draft_tokens,
                    py::handle seq_lens_this_time, py::handle seq_lens_decoder,
                    py::handle max_dec_len, int max_ngram_size, int min_ngram_size,
                    int max_draft_tokens, int threshold, int num_threads, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::pybind::StreamScratch scratch(AsStream(stream));
  fdmtp::HybridMtpNgram(
      args.Convert(input_ids, "input_ids"), args.Convert(input_ids_len, "input_ids_len"),
      args.Convert(pre_ids, "pre_ids"), args.Convert(step_idx, "step_idx"),
      args.Convert(draft_token_num, "draft_token_num"), args.Convert(draft_tokens, "draft_tokens"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"), args.Convert(max_dec_len, "max_dec_len"),
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
      args.Convert(input_ids, "input_ids"), args.Convert(input_ids_len, "input_ids_len"),
      args.Convert(token_ids_all, "token_ids_all"), args.Convert(prompt_lens, "prompt_lens"),
      args.Convert(step_idx, "step_idx"), args.Convert(draft_token_num, "draft_token_num"),
      args.Convert(draft_tokens, "draft_tokens"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"), args.Convert(max_dec_len, "max_dec_len"),
      max_ngram_size, max_draft_tokens, threshold, num_threads, AsStream(stream), &scratch);
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
}
