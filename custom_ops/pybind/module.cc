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
      args.Convert(input, "input"), args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"), args.Convert(stop_flags, "stop_flags"),
      args.Convert(accept_nums, "accept_nums"),
      args.Convert(base_model_seq_lens_this_time, "base_model_seq_lens_this_time"),
      args.Convert(base_model_seq_lens_encoder, "base_model_seq_lens_encoder"),
      actual_draft_token_num, args.Convert(out, "out"),
      args.Convert(output_token_num, "output_token_num"), AsStream(stream));
}

void EagleGetSelfHiddenStates(py::handle input, py::handle last_seq_lens_this_time,
                              py::handle seq_lens_this_time, py::handle seq_lens_encoder,
                              py::handle out, py::handle output_token_num, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::EagleGetSelfHiddenStates(
      args.Convert(input, "input"), args.Convert(last_seq_lens_this_time, "last_seq_lens_this_time"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"), args.Convert(out, "out"),
      args.Convert(output_token_num, "output_token_num"), AsStream(stream));
}

void EagleGatherHiddenStates(py::handle input, py::handle cu_seqlens_q,
                             py::handle seq_lens_this_time, py::handle seq_lens_decoder,
                             py::handle seq_lens_encoder, py::handle batch_id_per_token_output,
                             py::handle cu_seqlens_q_output, py::handle real_output_token_num,
                             py::handle out, py::handle output_token_num, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::EagleGatherHiddenStates(
      args.Convert(input, "input"), args.Convert(cu_seqlens_q, "cu_seqlens_q"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(batch_id_per_token_output, "batch_id_per_token_output"),
      args.Convert(cu_seqlens_q_output, "cu_seqlens_q_output"),
      args.Convert(real_output_token_num, "real_output_token_num"), args.Convert(out, "out"),
      args.Convert(output_token_num, "output_token_num"), AsStream(stream));
}

void SpeculateGetLogits(py::handle draft_logits, py::handle next_token_num,
                        py::handle batch_token_num, py::handle cu_next_token_offset,
                        py::handle cu_batch_token_offset, py::handle logits,
                        py::handle first_token_logits, py::handle seq_lens_this_time,
                        py::handle seq_lens_encoder, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::SpeculateGetLogits(
      args.Convert(draft_logits, "draft_logits"), args.Convert(next_token_num, "next_token_num"),
      args.Convert(batch_token_num, "batch_token_num"),
      args.Convert(cu_next_token_offset, "cu_next_token_offset"),
      args.Convert(cu_batch_token_offset, "cu_batch_token_offset"), args.Convert(logits, "logits"),
      args.Convert(first_token_logits, "first_token_logits"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"), AsStream(stream));
}

void UpdateAttnMaskOffsets(py::handle ids_remove_padding, py::handle seq_lens_this_time,
                           py::handle seq_lens_encoder, py::handle seq_lens_decoder,
                           py::handle cu_seqlens_q, py::handle attn_mask_offsets_full,
                           py::handle is_block_step, py::handle decode_states,
                           py::handle attn_mask_offsets, uintptr_t stream) {
  fdmtp::pybind::ArgScope args;
  fdmtp::UpdateAttnMaskOffsets(
      args.Convert(ids_remove_padding, "ids_remove_padding"),
      args.Convert(seq_lens_this_time, "seq_lens_this_time"),
      args.Convert(seq_lens_encoder, "seq_lens_encoder"),
      args.Convert(seq_lens_decoder, "seq_lens_decoder"), args.Convert(cu_seqlens_q, "cu_seqlens_q"),
      args.Convert(attn_mask_offsets_full, "attn_mask_offsets_full"),
      args.Convert(is_block_step, "is_block_step"), args.Convert(decode_states, "decode_states"),
      args.Convert(attn_mask_offsets, "attn_mask_offsets"), AsStream(stream));
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
}
