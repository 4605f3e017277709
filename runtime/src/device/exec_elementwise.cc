// The executor's elementwise ops on the vector and scalar engines, as
// lower_elementwise.cc lowers them: the unary and binary ops of the
// registry's Elementwise rows (float operands F32, BF16 or F16, the second
// repeating when shorter, a masked_fill mask BOOL or U8; computed in
// float32 and rounded once into the F32, BF16 or F16 output), fused chains
// of them, and the comparisons (float operands -> BOOL) and where (BOOL
// condition, float operands -> float).
#include "exec_kernels.h"

#include <algorithm>
#include <cstdint>
#include <unordered_set>

#include "exec_operands.h"
#include "fused_blocks.h"
#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {
namespace {

// Where each sub-op of fused instruction `i` (over n elements) reads its
// operands: kChainValue (the chain's value so far) or k, operands[k], the
// value of i.inputs(k). Checked here, before any block runs.
constexpr int kChainValue = -1;
std::vector<std::vector<int>> FusedSources(const proto::Instruction& i,
                                           const std::vector<FloatIn>& operands,
                                           std::size_t n, const What& what) {
  auto index_of = [&](std::uint32_t id) {
    for (std::size_t k = 0; k < operands.size(); ++k) {
      if (static_cast<std::uint32_t>(i.inputs(static_cast<int>(k))) == id)
        return static_cast<int>(k);
    }
    throw InvalidUsage(StrCat(what, ": a fused op reads buffer ", id, ", not an input"));
  };
  std::vector<std::vector<int>> sources;
  for (const auto& sub : i.fused()) {
    std::vector<int>& from = sources.emplace_back();
    for (auto id : sub.inputs()) {
      NEURON_CHECK(id != kFusedPrevious || sources.size() > 1, what, ": fused op ",
                   DeviceOpName(sub.op()),
                   " reads the chain's value before an op made it");
      from.push_back(id == kFusedPrevious ? kChainValue : index_of(id));
    }
    NEURON_CHECK(!from.empty() && (from[0] == kChainValue ||
                                   operands[static_cast<std::size_t>(from[0])].size == n),
                 what, ": fused op ", DeviceOpName(sub.op()),
                 " needs its first operand at full size");
  }
  NEURON_CHECK(!sources.empty(), what, ": a fused chain of no ops");
  return sources;
}

}  // namespace

void RunElementwise(const proto::Instruction& i, const std::vector<Placed>& in,
                    const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK((in.size() == 1 || in.size() == 2) && out.size() == 1, what,
               ": an elementwise op reads one or two buffers and writes one");
  const std::size_t n = static_cast<std::size_t>(i.elements());
  for (const Placed* p : {&in[0], &out[0]}) {
    NEURON_CHECK(kernels::IsFloat(p->buffer->dtype()), what, ": buffer ",
                 p->buffer->name(), " is ", proto::ElementType_Name(p->buffer->dtype()),
                 "; the engines compute F32, BF16 or F16");
  }
  NEURON_CHECK(out[0].elements() >= n, what, ": buffer ", out[0].buffer->name(), " has ",
               out[0].elements(), " elements, the op ", n);
  NEURON_CHECK(in[0].elements() >= n, what, ": buffer ", in[0].buffer->name(), " has ",
               in[0].elements(), " elements, the op ", n);
  if (n == 0) return;
  // A copy elided on the host: its source was placed in its target.
  if (i.op() == proto::OP_COPY && in[0].data == out[0].data &&
      in[0].buffer->dtype() == out[0].buffer->dtype())
    return;
  FloatIn a = FloatOperandIn(in[0], n, what), b;
  if (in.size() == 2) b = FloatOperandIn(in[1], n, what, i.op() == proto::OP_MASKED_FILL);
  // Written in place when the output is float32 and is `a` itself or apart
  // from both operands; else through a float32 result.
  const bool direct =
      out[0].buffer->dtype() == proto::F32 &&
      (static_cast<const void*>(a.data) == out[0].data ||
       !Overlap(a.data, n * sizeof(float), out[0].data, n * sizeof(float))) &&
      (in.size() == 1 ||
       !Overlap(b.data, b.size * sizeof(float), out[0].data, n * sizeof(float)));
  std::vector<float, UninitializedAllocator<float>> result(direct ? 0 : n);  // all written
  float* y = direct ? reinterpret_cast<float*>(out[0].data) : result.data();
  const bool known =
      in.size() == 1 ? kernels::Unary(i.op(), a.data, n, i.scalar(), y)
                     : kernels::Binary(i.op(), a.data, b.data, b.size, i.scalar(), y, n);
  NEURON_CHECK(known, what, ": ", DeviceOpName(i.op()), " is not a ",
               in.size() == 1 ? "unary" : "binary", " op");
  if (!direct) kernels::FromFloat(result.data(), n, out[0].buffer->dtype(), out[0].data);
}

// fused: a chain of elementwise ops in float32 (executable.proto,
// Instruction.fused). Every sub-op writes the chain's value in one place:
// the output's own memory when it holds float32 and no operand shares it
// (so no operand a later sub-op reads has been overwritten), else a float32
// result converted into the output at the end. The kernels work element by
// element, so a sub-op may read the value it overwrites; the chain runs
// block by block (FusedBlock), which gives the same elements.
void RunFused(const proto::Instruction& i, const std::vector<Placed>& in,
              const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(out.size() == 1 && kernels::IsFloat(out[0].buffer->dtype()), what,
               ": a fused chain writes one float buffer");
  const std::size_t n = static_cast<std::size_t>(i.elements());
  NEURON_CHECK(out[0].elements() >= n, what, ": ", n, " elements into ",
               out[0].elements());
  if (n == 0) return;
  std::unordered_set<std::uint32_t> masks;  // the masks of masked_fill sub-ops
  for (const auto& sub : i.fused()) {
    if (sub.op() == proto::OP_MASKED_FILL && sub.inputs_size() == 2)
      masks.insert(sub.inputs(1));
  }
  std::vector<FloatIn> operands;  // each input once, in place when float32
  operands.reserve(in.size());
  for (std::size_t k = 0; k < in.size(); ++k) {
    const bool mask =
        masks.count(static_cast<std::uint32_t>(i.inputs(static_cast<int>(k))));
    operands.push_back(FloatOperandIn(in[k], n, what, mask));
  }
  const std::vector<std::vector<int>> sources = FusedSources(i, operands, n, what);
  FloatOut value(out[0], n, operands);
  std::vector<std::size_t> periods;
  for (const FloatIn& o : operands) periods.push_back(o.size);
  const std::size_t block = detail::FusedBlock(n, periods);
  std::vector<FloatIn> args;  // a sub-op's operands over one block
  for (std::size_t base = 0; base < n; base += block) {
    const std::size_t len = std::min(block, n - base);
    float* into = value.data() + base;
    for (int s = 0; s < i.fused_size(); ++s) {
      const proto::Instruction& sub = i.fused(s);
      args.clear();
      for (int k : sources[static_cast<std::size_t>(s)]) {
        if (k == kChainValue) {
          args.push_back({into, len, {}});
          continue;
        }
        const FloatIn& o = operands[static_cast<std::size_t>(k)];
        const detail::OperandSpan span = detail::BlockOf(o.size, base, len, n);
        args.push_back({o.data + span.offset, span.size, {}});
      }
      const bool known =
          args.size() == 1
              ? kernels::Unary(sub.op(), args[0].data, len, sub.scalar(), into)
              : kernels::Binary(sub.op(), args[0].data, args[1].data, args[1].size,
                                sub.scalar(), into, len);
      NEURON_CHECK(known, what, ": unknown fused op '", DeviceOpName(sub.op()), "'");
    }
  }
  value.Finish();
}

// compare_{eq,ne,lt,le,gt,ge}: float operands (the second repeating, or
// the scalar when there is one operand) -> bool; where: (cond, a, b) ->
// a where cond is set, else b (b repeating).
void RunSelect(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what) {
  const std::size_t n = static_cast<std::size_t>(i.elements());
  NEURON_CHECK(!in.empty() && out.size() == 1 && out[0].elements() >= n, what, ": ",
               DeviceOpName(i.op()), " of ", n, " elements");
  auto operand = [&](std::size_t k) { return FloatOperand(in[k], n, what); };
  if (i.op() == proto::OP_WHERE) {
    NEURON_CHECK(in.size() == 3 && ElementBytes(in[0].buffer->dtype()) == 1 &&
                     in[0].elements() >= n && kernels::IsFloat(out[0].buffer->dtype()),
                 what, ": where takes a bool condition of ", n,
                 " and two float operands");
    const auto a = operand(1), b = operand(2);
    std::vector<float> y(n);
    for (std::size_t e = 0; e < n; ++e)
      y[e] = in[0].data[e] ? a[e % a.size()] : b[e % b.size()];
    kernels::FromFloat(y, out[0].buffer->dtype(), out[0].data);
    return;
  }
  NEURON_CHECK(ElementBytes(out[0].buffer->dtype()) == 1, what, ": ",
               DeviceOpName(i.op()), " writes bool");
  const auto a = operand(0);
  NEURON_CHECK(a.size() == n, what, ": the first operand needs ", n, " elements");
  const std::vector<float> b =
      in.size() > 1 ? operand(1) : std::vector<float>{static_cast<float>(i.scalar())};
  const proto::Op op = i.op();
  for (std::size_t e = 0; e < n; ++e) {
    const float x = a[e], y = b[e % b.size()];
    const bool r = op == proto::OP_COMPARE_EQ   ? x == y
                   : op == proto::OP_COMPARE_NE ? x != y
                   : op == proto::OP_COMPARE_LT ? x < y
                   : op == proto::OP_COMPARE_LE ? x <= y
                   : op == proto::OP_COMPARE_GT ? x > y
                                                : x >= y;
    out[0].data[e] = r ? 1 : 0;
  }
}

}  // namespace neuron::runtime::detail
