// The host side of the row-gather ops (eagle_get_hidden_states, eagle_get_self_hidden_states,
// eagle_gather_hidden_states): their shared argument checks, and the CPU loop of a row-gather
// plan (see fdmtp/row_gather.h): items in batch order, each output row copied (bit-exact,
// memcpy of the row) or zeroed.
#pragma once

#include <cstring>
#include <initializer_list>
#include <string>

#include "entry/checks.h"
#include "fdmtp/row_gather.h"

namespace fdmtp {

// input [T, H] float (dtype checked by the entry); out [out_rows, H] of input's dtype;
// output_token_num int32 [1]. Fills the sizes of `r`.
inline void CheckRowGather(const ArgChecker& check, const TensorRef& input, const TensorRef& out,
                           const TensorRef& output_token_num, int64_t out_rows, int64_t bsz,
                           const char* out_rows_from, RowGatherArgs* r) {
  check.Rank(input, 2);
  CheckShape(check, out, input.dtype, {out_rows, input.dim(1)},
             std::string("rows: ") + out_rows_from + ", width: `" + input.name + "`.shape[1]");
  CheckShape(check, output_token_num, DType::kInt32, {1}, "one count");
  r->in_rows = input.dim(0);
  r->out_rows = out_rows;
  r->hidden = input.dim(1);
  r->bsz = bsz;
}

// How many rows a row-gather op's `out` has: one per item (N), or as many as `input`.
enum class OutRows { kPerItem, kLikeInput };

// The Prepare of every row-gather op: the batch size N is seq_lens_this_time's; each tensor
// of `per_item` holds one value per item. The checks run in this order (the first failing
// one is reported).
template <typename Call>
void PrepareRowGather(const ArgChecker& check, const Call& call,
                      std::initializer_list<const TensorRef*> per_item, OutRows out_rows,
                      RowGatherArgs* r) {
  const int64_t bsz = BatchSize(check, call.seq_lens_this_time);
  check.PerItem(per_item, bsz, call.seq_lens_this_time);
  if (out_rows == OutRows::kLikeInput) {
    const int64_t rows = call.input.shape.size() == 2 ? call.input.dim(0) : 0;
    CheckRowGather(check, call.input, call.out, call.output_token_num, rows, bsz,
                   "`input`.shape[0]", r);
  } else {
    CheckRowGather(check, call.input, call.out, call.output_token_num, bsz, bsz,
                   "`seq_lens_this_time`.shape[0]", r);
  }
}

namespace cpu {

template <typename T, typename Plan>
void GatherRows(const Plan& plan) {
  const RowGatherArgs& r = plan.rows;
  const T* input = static_cast<const T*>(r.input);
  T* out = static_cast<T*>(r.out);
  const size_t row_bytes = static_cast<size_t>(r.hidden) * sizeof(T);
  // (hidden == 0: the rows are empty and the tensors may have no allocation)
  const bool has_data = row_bytes != 0;
  int64_t in_off = 0;
  int64_t out_off = 0;
  for (int64_t b = 0; b < r.bsz; ++b) {
    const ItemRows c = plan.Counts(b);
    for (int64_t j = 0; has_data && j < c.out && j < r.out_rows - out_off; ++j) {
      T* dst = out + (out_off + j) * r.hidden;
      const int64_t src = SourceRow(plan.Source(b, j, c), c, in_off, r.in_rows);
      if (src >= 0) {
        std::memcpy(dst, input + src * r.hidden, row_bytes);
      } else {
        std::memset(dst, 0, row_bytes);
      }
    }
    in_off = SatAdd(in_off, c.in);
    out_off = SatAdd(out_off, c.out);
  }
  for (int64_t row = out_off; has_data && row < r.out_rows; ++row) {
    std::memset(out + row * r.hidden, 0, row_bytes);
  }
  *r.output_token_num = SatInt32(out_off);  // the total saturates, never wraps
}

}  // namespace cpu
}  // namespace fdmtp

// Defines cpu::Kernel, the CPU kernel of a row-gather op, for every float type (the list of
// FDMTP_FOR_EACH_FLOAT_TYPE): GatherRows over the op's plan `Args`. The row-gather ops differ
// only in their plans (fdmtp/<op>.h), so each op's file holds this line and its Prepare.
#define FDMTP_DEFINE_ROW_GATHER_CPU_KERNEL(Kernel, Args) \
  namespace cpu {                                        \
  template <typename T>                                  \
  void Kernel(const Args& args) {                        \
    GatherRows<T>(args);                                 \
  }                                                      \
  template void Kernel<float>(const Args&);              \
  template void Kernel<Float16>(const Args&);            \
  template void Kernel<BFloat16>(const Args&);           \
  }
