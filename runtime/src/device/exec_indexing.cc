// The executor's indexing and random ops on GpSimd, as lower_indexing.cc
// lowers them: gather_rows (raw elements of any dtype, I32 or I64
// indices) and scatter_add_rows (F32, BF16 or F16, summed in float32);
// iota, with fill (lower_views.cc's constants) as the same arithmetic
// sequence kernel, into any numeric dtype; dropout, masked_scale and
// bernoulli (float data, an I64 seed, BOOL or U8 masks), drawn from a
// SplitMix64 hash of (seed, stream, element).
#include "exec_kernels.h"

#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {
namespace {

// SplitMix64: the counter-based hash dropout draws its bits from.
std::uint64_t Mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Element e's uniform draw in [0, 1) of stream `k` under the run's seed
// (an int64 buffer of one element).
class Draws {
 public:
  Draws(const Placed& seed, std::int64_t k, const What& what) {
    NEURON_CHECK(seed.buffer->dtype() == proto::I64 && seed.elements() == 1, what,
                 ": the seed must be one int64");
    std::int64_t value;
    std::memcpy(&value, seed.data, sizeof(value));
    base_ = Mix(static_cast<std::uint64_t>(value) ^ Mix(static_cast<std::uint64_t>(k)));
  }
  double operator()(std::size_t e) const {
    return static_cast<double>(Mix(base_ + e) >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t base_;
};

std::vector<std::int64_t> Indices(const Placed& p, std::size_t n, const What& what) {
  const auto type = p.buffer->dtype();
  NEURON_CHECK(type == proto::I64 || type == proto::I32, what, ": indices are ",
               proto::ElementType_Name(type), ", not I64 or I32");
  NEURON_CHECK(p.elements() >= n, what, ": ", p.elements(), " indices, the op needs ", n);
  std::vector<std::int64_t> out(n);
  for (std::size_t e = 0; e < n; ++e) {
    out[e] = type == proto::I64 ? reinterpret_cast<const std::int64_t*>(p.data)[e]
                                : reinterpret_cast<const std::int32_t*>(p.data)[e];
  }
  return out;
}

}  // namespace

// fill (every element the scalar) and iota (element e = scalar + e *
// step): an arithmetic sequence into one buffer of any numeric dtype.
void RunSequence(const proto::Instruction& i, const std::vector<Placed>& in,
                 const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.empty() && out.size() == 1, what, ": ", DeviceOpName(i.op()),
               " reads nothing and writes one buffer");
  const std::size_t n = static_cast<std::size_t>(i.elements());
  NEURON_CHECK(out[0].elements() >= n, what, ": buffer ", out[0].buffer->name(), " has ",
               out[0].elements(), " elements, the op ", n);
  const double start = i.scalar(), step = i.op() == proto::OP_IOTA ? i.step() : 0.0;
  const auto type = out[0].buffer->dtype();
  if (kernels::IsFloat(type)) {
    std::vector<float> v(n);
    for (std::size_t e = 0; e < n; ++e) v[e] = static_cast<float>(start + e * step);
    kernels::FromFloat(v, type, out[0].data);
    return;
  }
  for (std::size_t e = 0; e < n; ++e) {
    const auto v = static_cast<std::int64_t>(start + static_cast<double>(e) * step);
    switch (ElementBytes(type)) {
      case 8:
        reinterpret_cast<std::int64_t*>(out[0].data)[e] = v;
        break;
      case 4:
        reinterpret_cast<std::int32_t*>(out[0].data)[e] = static_cast<std::int32_t>(v);
        break;
      default:
        out[0].data[e] = static_cast<std::uint8_t>(v);
    }
  }
}

// gather_rows and scatter_add_rows (executor.h): embedding and its backward.
void RunRows(const proto::Instruction& i, const std::vector<Placed>& in,
             const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.size() == 2 && out.size() == 1, what, ": ", DeviceOpName(i.op()),
               " reads rows and indices, writes one buffer");
  const std::int64_t m = i.m(), n = i.n(), k = i.k();
  const auto index = Indices(in[1], static_cast<std::size_t>(m), what);
  for (std::int64_t r = 0; r < m; ++r) {
    NEURON_CHECK(index[r] >= 0 && index[r] < k, what, ": index ", index[r], " (position ",
                 r, ") is outside the ", k, " rows");
  }
  if (i.op() == proto::OP_GATHER_ROWS) {
    NEURON_CHECK(in[0].buffer->dtype() == out[0].buffer->dtype() &&
                     in[0].elements() >= static_cast<std::size_t>(k * n) &&
                     out[0].elements() >= static_cast<std::size_t>(m * n),
                 what, ": a table of ", in[0].elements(), " elements into ",
                 out[0].elements(), " do not fit ", k, "x", n, " rows gathered ", m,
                 " times");
    const std::size_t row =
        static_cast<std::size_t>(n) * ElementBytes(in[0].buffer->dtype());
    for (std::int64_t r = 0; r < m; ++r) {
      std::memcpy(out[0].data + r * row, in[0].data + index[r] * row, row);
    }
    return;
  }
  NEURON_CHECK(kernels::IsFloat(in[0].buffer->dtype()) &&
                   kernels::IsFloat(out[0].buffer->dtype()) &&
                   in[0].elements() >= static_cast<std::size_t>(m * n) &&
                   out[0].elements() >= static_cast<std::size_t>(k * n),
               what, ": ", m, " float rows of ", n, " into ", k);
  const auto grad = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), m * n);
  std::vector<float> sum(static_cast<std::size_t>(k * n), 0.0f);
  const auto skip = static_cast<std::int64_t>(i.scalar());
  for (std::int64_t r = 0; r < m; ++r) {
    if (skip >= 0 && index[r] == skip) continue;
    for (std::int64_t c = 0; c < n; ++c) sum[index[r] * n + c] += grad[r * n + c];
  }
  kernels::FromFloat(sum, out[0].buffer->dtype(), out[0].data);
}

// dropout: keep element e when hash(seed, stream, e) >= p, scaled by
// 1 / (1 - p); masked_scale: grad x scale where the mask is set, else 0.
void RunDropout(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what) {
  const std::size_t n = static_cast<std::size_t>(i.elements());
  const bool forward = i.op() == proto::OP_DROPOUT;
  NEURON_CHECK(in.size() == 2 && out.size() == (forward ? 2u : 1u), what, ": ",
               DeviceOpName(i.op()), " takes two inputs");
  NEURON_CHECK(kernels::IsFloat(out[0].buffer->dtype()), what, ": ", DeviceOpName(i.op()),
               " writes float");
  NEURON_CHECK(kernels::IsFloat(in[0].buffer->dtype()) && in[0].elements() >= n &&
                   out[0].elements() >= n,
               what, ": ", n, " float elements");
  std::vector<float> y(n);
  if (i.op() == proto::OP_BERNOULLI) {  // 1 where hash(seed, k, e) < p
    const Draws draw(in[1], i.k(), what);
    for (std::size_t e = 0; e < n; ++e) y[e] = draw(e) < i.scalar() ? 1.0f : 0.0f;
    kernels::FromFloat(y, out[0].buffer->dtype(), out[0].data);
    return;
  }
  const auto x = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), n);
  if (!forward) {
    NEURON_CHECK(in[1].elements() >= n && ElementBytes(in[1].buffer->dtype()) == 1, what,
                 ": the mask must be bool or uint8 of ", n);
    const float scale = static_cast<float>(i.scalar());
    for (std::size_t e = 0; e < n; ++e) y[e] = in[1].data[e] != 0 ? x[e] * scale : 0.0f;
    kernels::FromFloat(y, out[0].buffer->dtype(), out[0].data);
    return;
  }
  NEURON_CHECK(out[1].elements() >= n && ElementBytes(out[1].buffer->dtype()) == 1, what,
               ": the mask must be bool or uint8 of ", n);
  const Draws draw(in[1], i.k(), what);
  const double p = i.scalar();
  const float scale = p > 0 ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
  for (std::size_t e = 0; e < n; ++e) {
    const bool keep = draw(e) >= p;
    out[1].data[e] = keep ? 1 : 0;
    y[e] = keep ? x[e] * scale : 0.0f;
  }
  kernels::FromFloat(y, out[0].buffer->dtype(), out[0].data);
}

}  // namespace neuron::runtime::detail
