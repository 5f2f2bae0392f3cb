// Row gather: the shared shape of the hidden-state ops (eagle_get_hidden_states,
// eagle_get_self_hidden_states, eagle_gather_hidden_states).
//
// Item b owns `in` consecutive input rows and `out` consecutive output rows, laid out in
// batch order: item b's input rows start at in_off[b] = sum of `in` over items < b, its
// output rows at out_off[b] = sum of `out` over items < b. Its j-th output row
// (j < out) copies input row in_off[b] + Source(b, j, counts), or is zero when Source
// returns a row outside [0, in) or past the end of the input. Output rows that no item
// owns are zero, so every output row is written exactly once (never left uninitialised).
// output_token_num = the sum of `out` over all items.
//
// A plan is a struct holding `RowGatherArgs rows` plus the op's per-item tensors, with
//   FDMTP_HOST_DEVICE ItemRows Counts(int64_t b) const;
//   FDMTP_HOST_DEVICE int64_t Source(int64_t b, int64_t j, ItemRows counts) const;
// The CPU loop (cpu/row_gather.h) and the CUDA kernel (gpu/row_gather.cuh) run any plan.
#pragma once

#include "fdmtp/common.h"

namespace fdmtp {

struct ItemRows {
  int64_t in;   // input rows the item occupies
  int64_t out;  // output rows the item produces
};

struct RowGatherArgs {
  FDMTP_GM const void* input;          // [in_rows, hidden] float32/float16/bfloat16, in
  FDMTP_GM void* out;                  // [out_rows, hidden] same dtype, out: every row written
  FDMTP_GM int32_t* output_token_num;  // [1] int32, out: sum of the items' output rows
  int64_t in_rows;
  int64_t out_rows;
  int64_t hidden;
  int64_t bsz;
};

// Item-local source row `local` of an item with `counts`, placed at `in_off`: the global
// input row, or -1 when the row does not exist (the output row is then zero).
FDMTP_HOST_DEVICE inline int64_t SourceRow(int64_t local, ItemRows counts, int64_t in_off,
                                           int64_t in_rows) {
  if (local < 0 || local >= counts.in) return -1;
  const int64_t row = in_off + local;
  return row < in_rows ? row : -1;
}

}  // namespace fdmtp
