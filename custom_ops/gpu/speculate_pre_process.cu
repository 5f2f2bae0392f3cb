#include "cuda_utils.cuh"
#include "fdmtp/kernels.h"

namespace fdmtp {
namespace cuda {
namespace {

// Fill values first, so every slot of every output is defined whatever the lengths say.
__global__ void SpeculatePreProcessFillKernel(SpeculatePreProcessArgs args) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t t = start; t < args.token_num; t += stride) {
    args.ids_remove_padding[t] = kPaddingTokenFill;
    args.batch_id_per_token[t] = kNoBatchId;
  }
  for (int64_t r = start; r < args.output_capacity; r += stride) {
    args.batch_id_per_token_output[r] = kNoBatchId;
  }
}

// One block scans the input and output lengths over the batch, chunk by chunk. The carries
// saturate at the int32 maximum (SpeculateOffsetAdd): a chunk's exclusive sums are at most
// kScanThreads * 2**31, so nothing overflows in int64 before the clamp.
__global__ void SpeculatePreProcessScanKernel(SpeculatePreProcessArgs args) {
  int64_t carry_in = 0;
  int64_t carry_out = 0;
  for (int64_t base = 0; base < args.bsz; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const bool valid = b < args.bsz;
    int64_t total_in = 0;
    int64_t total_out = 0;
    const int64_t before_in = SpeculateOffsetAdd(
        carry_in, BlockExclusiveSum(valid ? SpeculateInputTokens(args, b) : 0, &total_in));
    const int64_t before_out = SpeculateOffsetAdd(
        carry_out, BlockExclusiveSum(valid ? SpeculateOutputRows(args, b) : 0, &total_out));
    if (b == 0) {
      args.cu_seqlens_q[0] = 0;
      args.cu_seqlens_k[0] = 0;
      args.cu_seq_lens_q_output[0] = 0;
    }
    if (valid) {
      const int32_t in_end =
          static_cast<int32_t>(SpeculateOffsetAdd(before_in, SpeculateInputTokens(args, b)));
      args.cu_seqlens_q[b + 1] = in_end;
      args.cu_seqlens_k[b + 1] = in_end;
      args.cu_seq_lens_q_output[b + 1] =
          static_cast<int32_t>(SpeculateOffsetAdd(before_out, SpeculateOutputRows(args, b)));
    }
    carry_in = SpeculateOffsetAdd(carry_in, total_in);
    carry_out = SpeculateOffsetAdd(carry_out, total_out);
  }
  if (threadIdx.x == 0) {
    if (args.bsz == 0) {
      args.cu_seqlens_q[0] = 0;
      args.cu_seqlens_k[0] = 0;
      args.cu_seq_lens_q_output[0] = 0;
    }
    *args.real_output_token_num = static_cast<int32_t>(carry_out);
  }
}

// A block per item (grid-stride over items), threads over the item's tokens and rows that
// land inside the outputs (bounded by the buffers, not by the length values).
__global__ void SpeculatePreProcessScatterKernel(SpeculatePreProcessArgs args) {
  for (int64_t b = blockIdx.x; b < args.bsz; b += gridDim.x) {
    const int64_t n = SpeculateTokensInBounds(args, b);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) SpeculatePreProcessToken(args, b, i);
    const int64_t rows = SpeculateRowsInBounds(args, b);
    for (int64_t j = threadIdx.x; j < rows; j += blockDim.x)
      SpeculatePreProcessOutputRow(args, b, j);
  }
}

}  // namespace

int SpeculatePreProcess(const SpeculatePreProcessArgs& args, Stream stream) {
  cudaStream_t s = AsCudaStream(stream);
  const int64_t fill_items =
      args.token_num > args.output_capacity ? args.token_num : args.output_capacity;
  FDMTP_CUDA_CALL(
      Launch<SpeculatePreProcessFillKernel>(BlocksFor(fill_items), kThreadsPerBlock, 0, s, args));
  FDMTP_CUDA_CALL(Launch<SpeculatePreProcessScanKernel>(1, kScanThreads, 0, s, args));
  if (args.bsz > 0) {
    const int blocks = static_cast<int>(args.bsz < kMaxBlocks ? args.bsz : kMaxBlocks);
    FDMTP_CUDA_CALL(Launch<SpeculatePreProcessScatterKernel>(blocks, 128, 0, s, args));
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace fdmtp
