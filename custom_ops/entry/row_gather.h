// Checks and dispatch shared by the row-gather op entries (eagle_get_hidden_states,
// eagle_get_self_hidden_states, eagle_gather_hidden_states).
#pragma once

#include "checks.h"
#include "dispatch.h"
#include "fdmtp/dtype_dispatch.h"

namespace fdmtp {

// input [T, H] float; out [out_rows, H] of input's dtype; output_token_num int32 [1].
inline RowGatherArgs CheckRowGather(const ArgChecker& check, const TensorRef& input,
                                    const TensorRef& out, const TensorRef& output_token_num,
                                    int64_t out_rows, int64_t bsz, const char* out_rows_from) {
  DispatchFloat(check, input, [](auto) {});
  check.Rank(input, 2);
  check.Contiguous(input);
  CheckShape(check, out, input.dtype, {out_rows, input.dim(1)},
             std::string("rows: ") + out_rows_from + ", width: `" + input.name + "`.shape[1]");
  CheckShape(check, output_token_num, DType::kInt32, {1}, "one count");
  RowGatherArgs r;
  r.input = input.data;
  r.out = out.data;
  r.output_token_num = output_token_num.ptr<int32_t>();
  r.in_rows = input.dim(0);
  r.out_rows = out_rows;
  r.hidden = input.dim(1);
  r.bsz = bsz;
  return r;
}

// Runs the CPU kernel, the CUDA launcher or the XPU plugin function (xpu_op, the op's
// snake_case name) of a row-gather op for input's element type.
#define FDMTP_DISPATCH_ROW_GATHER(check, input, args, stream, OP, xpu_op)                  \
  DispatchFloat(check, input, [&](auto tag) {                                                \
    using T = typename decltype(tag)::type;                                                  \
    Dispatch(                                                                                \
        check, input.device, [&] { cpu::OP<T>(args); },                                      \
        [&] { return cuda::OP<T>(args, stream); },                                           \
        [&](xpu::Context* ctx) { return xpu::xpu_op<T>(ctx, args); });                       \
  })

}  // namespace fdmtp
