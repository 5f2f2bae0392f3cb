#include <limits>

#include "dispatch.h"
#include "fdmtp/ops.h"

namespace fdmtp {

void MtpStepPaddle(const TensorRef& base_model_stop_flags, const TensorRef& stop_flags,
                   const TensorRef& batch_drop, const TensorRef& seq_lens_this_time,
                   const TensorRef& seq_lens_encoder, const TensorRef& seq_lens_decoder,
                   const TensorRef& block_tables, const TensorRef& encoder_block_lens,
                   const TensorRef& used_list_len, const TensorRef& free_list,
                   const TensorRef& free_list_len, int block_size, int max_draft_tokens,
                   void* stream) {
  const ArgChecker check("mtp_step_paddle");
  const std::vector<const TensorRef*> all = {
      &base_model_stop_flags, &stop_flags,         &batch_drop,    &seq_lens_this_time,
      &seq_lens_encoder,      &seq_lens_decoder,   &block_tables,  &encoder_block_lens,
      &used_list_len,         &free_list,          &free_list_len};
  check.SameDevice(all);
  for (const TensorRef* t : {&base_model_stop_flags, &stop_flags, &batch_drop}) {
    check.Dtype(*t, DType::kBool);
  }
  for (const TensorRef* t : {&seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder,
                             &block_tables, &encoder_block_lens, &used_list_len, &free_list,
                             &free_list_len}) {
    check.Dtype(*t, DType::kInt32);
  }
  const int64_t bsz = check.ItemCount(seq_lens_this_time);
  for (const TensorRef* t : {&base_model_stop_flags, &stop_flags, &batch_drop, &seq_lens_encoder,
                             &seq_lens_decoder, &encoder_block_lens, &used_list_len}) {
    check.PerItem(*t, bsz, seq_lens_this_time);
  }
  check.Rows(block_tables, bsz, seq_lens_this_time);
  check.Rank(free_list, 1);
  check.Numel(free_list_len, 1);
  check.AttrAtLeast("block_size", block_size, 1);
  check.AttrAtLeast("max_draft_tokens", max_draft_tokens, 0);
  for (const TensorRef* t : all) check.Contiguous(*t);
  // Host tensors are value-checked (device tensors are not read back: no sync; the kernel
  // drops pushes past the free list and table slots past a row instead).
  for (const TensorRef* t : {&seq_lens_decoder, &encoder_block_lens, &used_list_len}) {
    check.ValuesInRangeOnHost(*t, 0, std::numeric_limits<int32_t>::max());
  }
  check.ValuesInRangeOnHost(free_list_len, 0, free_list.dim(0));

  MtpStepArgs args;
  args.base_model_stop_flags = base_model_stop_flags.ptr<const bool>();
  args.stop_flags = stop_flags.ptr<bool>();
  args.batch_drop = batch_drop.ptr<bool>();
  args.seq_lens_this_time = seq_lens_this_time.ptr<int32_t>();
  args.seq_lens_decoder = seq_lens_decoder.ptr<int32_t>();
  args.block_tables = block_tables.ptr<int32_t>();
  args.encoder_block_lens = encoder_block_lens.ptr<int32_t>();
  args.used_list_len = used_list_len.ptr<int32_t>();
  args.free_list = free_list.ptr<int32_t>();
  args.free_list_len = free_list_len.ptr<int32_t>();
  args.bsz = bsz;
  args.max_blocks = block_tables.dim(1);
  args.free_capacity = free_list.dim(0);
  args.block_size = block_size;
  args.max_draft_tokens = max_draft_tokens;
  Dispatch(
      check, seq_lens_this_time.device, [&] { cpu::MtpStepPaddle(args); },
      [&] { return cuda::MtpStepPaddle(args, stream); },
      [&](xpu::Context* ctx) { return xpu::mtp_step_paddle(ctx, args); });
}

}  // namespace fdmtp
