// The executor's scans along the middle dimension of [m, n, k], as
// lower_scans.cc lowers them: cumsum (F32, BF16 or F16 in and out, summed
// in order by kernels::Cumsum) and reverse (raw elements of any dtype, the
// same in and out).
#include "exec_kernels.h"

#include <cstdint>
#include <cstring>

#include "exec_operands.h"
#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {

// The scans along the middle dimension of [m, n, k] (m outer, n along
// the scan, k inner): cumsum (float, kernels::Cumsum) and reverse (raw
// elements of any dtype, bitwise: out[o, t, i] = in[o, n - 1 - t, i]).
void RunScan(const proto::Instruction& i, const std::vector<Placed>& in,
             const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.size() == 1 && out.size() == 1, what, ": ", DeviceOpName(i.op()),
               " reads one buffer and writes one");
  const std::int64_t outer = i.m(), len = i.n(), inner = i.k();
  NEURON_CHECK(outer >= 0 && len >= 0 && inner >= 0 && i.elements() == outer * len * inner,
               what, ": ", DeviceOpName(i.op()), " of [", outer, ", ", len, ", ", inner,
               "] over ", i.elements(), " elements");
  const auto n = static_cast<std::size_t>(i.elements());
  NEURON_CHECK(in[0].elements() >= n && out[0].elements() >= n, what, ": buffers of ",
               in[0].elements(), " and ", out[0].elements(), " elements, the scan ", n);
  if (n == 0) return;
  if (i.op() == proto::OP_REVERSE) {
    NEURON_CHECK(in[0].buffer->dtype() == out[0].buffer->dtype(), what, ": reverses ",
                 proto::ElementType_Name(in[0].buffer->dtype()), " into ",
                 proto::ElementType_Name(out[0].buffer->dtype()));
    const std::size_t row = static_cast<std::size_t>(inner) * ElementBytes(in[0].buffer->dtype());
    const std::vector<std::uint8_t> source(in[0].data, in[0].data + n / inner * row);
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t t = 0; t < len; ++t) {
        std::memcpy(out[0].data + static_cast<std::size_t>(o * len + t) * row,
                    source.data() + static_cast<std::size_t>(o * len + len - 1 - t) * row, row);
      }
    }
    return;
  }
  for (const Placed* p : {&in[0], &out[0]}) {
    NEURON_CHECK(kernels::IsFloat(p->buffer->dtype()), what, ": buffer ",
                 p->buffer->name(), " is ", proto::ElementType_Name(p->buffer->dtype()),
                 "; the engines compute F32, BF16 or F16");
  }
  std::vector<FloatIn> operands{FloatOperandIn(in[0], n, what)};
  FloatOut result(out[0], n, operands);
  if (out[0].buffer->dtype() == proto::F32) {
    kernels::Cumsum<double>(operands[0].data, outer, len, inner, result.data());
  } else {
    kernels::Cumsum<float>(operands[0].data, outer, len, inner, result.data());
  }
  result.Finish();
}

}  // namespace neuron::runtime::detail
