// The executor's tensor engine, as lower_matmul.cc lowers it: matmul,
// output[M,N] (F32, PSUM) = or += input0[M,K] x input1[K,N] (F32, BF16 or
// F16, read as float32), `batch` such products, either operand stored
// transposed; kernels::Matmul (the sgemm) computes it.
#include "exec_kernels.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "exec_operands.h"
#include "kernels.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {
namespace {

// The `n` float32 elements of `p`: its memory itself when it holds float32
// and does not overlap `out` (which the op writes), else a converted copy
// kept in `copy`.
const float* FloatView(const Placed& p, std::int64_t n, const Placed& out,
                       std::vector<float>& copy) {
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  if (p.buffer->dtype() == proto::F32 &&
      !Overlap(p.data, bytes, out.data, out.buffer->bytes())) {
    return reinterpret_cast<const float*>(p.data);
  }
  copy = kernels::ToFloat(p.data, p.buffer->dtype(), static_cast<std::size_t>(n));
  return copy.data();
}

}  // namespace

void RunMatmul(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(i.op() == proto::OP_MATMUL, what, ": the tensor engine runs matmul only");
  NEURON_CHECK(in.size() == 2 && out.size() == 1, what,
               ": matmul reads two buffers, writes one");
  for (const Placed& p : in) {
    NEURON_CHECK(kernels::IsFloat(p.buffer->dtype()), what, ": input ", p.buffer->name(),
                 " is ", proto::ElementType_Name(p.buffer->dtype()),
                 "; matmul takes F32, BF16 or F16");
  }
  NEURON_CHECK(out[0].buffer->dtype() == proto::F32, what,
               ": matmul writes F32 (PSUM), not ",
               proto::ElementType_Name(out[0].buffer->dtype()));
  const std::int64_t m = i.m(), k = i.k(), n = i.n(),
                     batch = std::max<std::int64_t>(i.batch(), 1);
  NEURON_CHECK(in[0].elements() == static_cast<std::size_t>(batch * m * k) &&
                   in[1].elements() == static_cast<std::size_t>(batch * k * n) &&
                   out[0].elements() == static_cast<std::size_t>(batch * m * n),
               what, ": buffers of ", in[0].elements(), ", ", in[1].elements(), " and ",
               out[0].elements(), " elements do not fit ", batch, " x ", m, "x", k, " x ",
               k, "x", n);
  constexpr std::int64_t kMaxDim = std::numeric_limits<std::int32_t>::max();
  NEURON_CHECK(m <= kMaxDim && k <= kMaxDim && n <= kMaxDim, what, ": a matmul of ", m,
               "x", k, " x ", k, "x", n, " has a dimension over 2^31 - 1");
  auto* c = reinterpret_cast<float*>(out[0].data);
  std::vector<float> a_copy, b_copy;
  const float* a = FloatView(in[0], batch * m * k, out[0], a_copy);
  const float* b = FloatView(in[1], batch * k * n, out[0], b_copy);
  kernels::Matmul(a, b, c, batch, m, k, n, i.accumulate(), i.transpose_lhs(),
                  i.transpose_rhs());
}

}  // namespace neuron::runtime::detail
