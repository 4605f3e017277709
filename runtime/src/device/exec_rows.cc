// The executor's row-wise ops over [m, n] row-major inputs, as
// lower_rows.cc lowers them: the registry's Shaped rows (transpose,
// sum_rows, softmax_rows, log_softmax_rows and their _backward_rows;
// kernels::Shaped), layer_norm_rows and its backward (kernels::LayerNorm),
// and nll_loss_rows and its backward. Float buffers (F32, BF16 or F16)
// computed in float32; nll_loss's targets I64.
#include "exec_kernels.h"

#include <cstdint>

#include "exec_operands.h"
#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {

// The row-wise ops over [m, n] inputs (kernels::Shaped).
void RunShaped(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(!in.empty() && out.size() == 1, what, ": a row-wise op writes one buffer");
  for (const Placed* p : {&in[0], &in.back(), &out[0]}) {
    NEURON_CHECK(kernels::IsFloat(p->buffer->dtype()), what, ": buffer ",
                 p->buffer->name(), " is ", proto::ElementType_Name(p->buffer->dtype()),
                 "; the engines compute F32, BF16 or F16");
  }
  const std::size_t n = static_cast<std::size_t>(i.elements());
  const std::size_t rows = static_cast<std::size_t>(i.m()),
                    cols = static_cast<std::size_t>(i.n());
  const std::size_t writes = i.op() == proto::OP_SUM_ROWS ? cols : rows * cols;
  const std::size_t inputs = static_cast<std::size_t>(FindDeviceOp(i.op())->inputs);
  bool fits = in.size() == inputs && n == writes;
  for (const Placed& p : in) fits = fits && p.elements() >= rows * cols;
  NEURON_CHECK(fits, what, ": ", DeviceOpName(i.op()), " of [", rows, ", ", cols,
               "] takes ", inputs, " input(s) of ", rows * cols, " elements and writes ",
               writes, "; got ", in.size(), " input(s) of ", in[0].elements(), " and ",
               n);
  std::vector<FloatIn> operands;
  std::vector<const float*> data;
  for (const Placed& p : in) {
    operands.push_back(FloatOperandIn(p, rows * cols, what));
    data.push_back(operands.back().data);
  }
  FloatOut result(out[0], n, operands);
  kernels::Shaped(i.op(), data, i.m(), i.n(), result.data());
  result.Finish();
}

// layer_norm_rows (x, w, b -> y, mean, rstd) and layer_norm_backward_rows
// (g, x, mean, rstd, w -> gx, gw, gb) over [m, n].
void RunLayerNorm(const proto::Instruction& i, const std::vector<Placed>& in,
                  const std::vector<Placed>& out, const What& what) {
  const bool forward = i.op() == proto::OP_LAYER_NORM_ROWS;
  const std::size_t rows = static_cast<std::size_t>(i.m()),
                    cols = static_cast<std::size_t>(i.n());
  const std::vector<std::size_t> in_sizes =
      forward ? std::vector<std::size_t>{rows * cols, cols, cols}
              : std::vector<std::size_t>{rows * cols, rows * cols, rows, rows, cols};
  const std::vector<std::size_t> out_sizes =
      forward ? std::vector<std::size_t>{rows * cols, rows, rows}
              : std::vector<std::size_t>{rows * cols, cols, cols};
  bool fits = in.size() >= in_sizes.size() && out.size() == out_sizes.size();
  for (std::size_t k = 0; fits && k < in_sizes.size(); ++k)
    fits = in[k].elements() == in_sizes[k];
  for (std::size_t k = 0; fits && k < out_sizes.size(); ++k)
    fits = out[k].elements() == out_sizes[k];
  NEURON_CHECK(fits, what, ": ", DeviceOpName(i.op()), " of [", rows, ", ", cols,
               "]: the buffers do not have the sizes the op reads and writes");
  std::vector<FloatIn> a;
  for (std::size_t k = 0; k < in_sizes.size(); ++k) {
    NEURON_CHECK(kernels::IsFloat(in[k].buffer->dtype()), what, ": input ",
                 in[k].buffer->name(), " is not a float buffer");
    a.push_back(FloatOperandIn(in[k], in_sizes[k], what));
  }
  std::vector<FloatOut> r;
  r.reserve(out.size());
  for (std::size_t k = 0; k < out.size(); ++k) {
    NEURON_CHECK(kernels::IsFloat(out[k].buffer->dtype()), what, ": output ",
                 out[k].buffer->name(), " is not a float buffer");
    r.emplace_back(out[k], out_sizes[k], a);
  }
  if (forward) {
    kernels::LayerNorm(a[0].data, a[1].data, a[2].data, i.m(), i.n(), i.scalar(),
                       r[0].data(), r[1].data(), r[2].data());
  } else {
    kernels::LayerNormBackward(a[0].data, a[1].data, a[2].data, a[3].data, a[4].data,
                               i.m(), i.n(), r[0].data(), r[1].data(), r[2].data());
  }
  for (FloatOut& o : r) o.Finish();
}

// nll_loss_rows (log-probabilities [m, n], int64 targets [m] -> loss,
// total weight) and nll_loss_backward_rows (grad, targets, total weight ->
// the log-probabilities' grad [m, n]); mean (scalar 1) or sum (scalar 2)
// reduction; targets equal to `k` are ignored.
void RunNllLoss(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what) {
  const bool forward = i.op() == proto::OP_NLL_LOSS_ROWS;
  const std::size_t rows = static_cast<std::size_t>(i.m()),
                    cols = static_cast<std::size_t>(i.n());
  const bool mean = i.scalar() == 1.0;
  const bool none = i.scalar() == 0.0;  // per-row losses
  const std::int64_t ignore = i.k();
  const Placed& target = in.at(1);
  NEURON_CHECK(in.size() == (forward ? 2u : 3u) && out.size() == (forward ? 2u : 1u) &&
                   target.buffer->dtype() == proto::I64 && target.elements() == rows,
               what, ": ", DeviceOpName(i.op()), " of [", rows, ", ", cols,
               "] takes its inputs and int64 targets of ", rows);
  const auto* t = reinterpret_cast<const std::int64_t*>(target.data);
  for (std::size_t r = 0; r < rows; ++r) {
    NEURON_CHECK(t[r] == ignore || (t[r] >= 0 && static_cast<std::size_t>(t[r]) < cols),
                 what, ": target ", t[r], " of row ", r, " is not a class in 0..",
                 cols - 1);
  }
  if (forward) {
    NEURON_CHECK(in[0].elements() == rows * cols &&
                     out[0].elements() == (none ? rows : 1) && out[1].elements() == 1,
                 what, ": buffer sizes do not match [", rows, ", ", cols, "]");
    const auto logp = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), rows * cols);
    std::vector<float> per_row(rows, 0.0f);
    float loss = 0, weight = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      if (t[r] == ignore) continue;
      per_row[r] = -logp[r * cols + t[r]];
      loss += per_row[r];
      weight += 1;
    }
    if (mean) loss /= weight;
    kernels::FromFloat(none ? per_row : std::vector<float>{loss}, out[0].buffer->dtype(),
                       out[0].data);
    kernels::FromFloat({weight}, out[1].buffer->dtype(), out[1].data);
    return;
  }
  NEURON_CHECK(in[0].elements() == (none ? rows : 1) && in[2].elements() == 1 &&
                   out[0].elements() == rows * cols,
               what, ": buffer sizes do not match [", rows, ", ", cols, "]");
  const auto grad = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), none ? rows : 1);
  const float total = kernels::ToFloat(in[2].data, in[2].buffer->dtype(), 1)[0];
  std::vector<float> g(rows * cols, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    if (t[r] == ignore) continue;
    g[r * cols + t[r]] = none ? -grad[r] : mean ? -grad[0] / total : -grad[0];
  }
  kernels::FromFloat(g, out[0].buffer->dtype(), out[0].data);
}

}  // namespace neuron::runtime::detail
