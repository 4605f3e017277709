#include "neuron/parallel/step_pricing.h"

#include <algorithm>
#include <cmath>

#include "neuron/runtime/device/eager_cost.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {

using runtime::CostModel;
using runtime::EagerKind;
using runtime::Engine;

namespace {

// The op's kind by runtime::Name(EagerKind), the names the capture wrote.
EagerKind KindOf(const proto::CapturedOp& op) {
  NEURON_CHECK(op.batch() >= 0 && op.m() >= 0 && op.k() >= 0 && op.n() >= 0 &&
                   op.elements() >= 0,
               "captured op ", op.name(), ": negative sizes");
  for (EagerKind kind : {EagerKind::kView, EagerKind::kMatmul, EagerKind::kVector,
                         EagerKind::kScalar, EagerKind::kCopy, EagerKind::kFallback,
                         EagerKind::kUnknown}) {
    if (op.kind() == runtime::Name(kind)) return kind;
  }
  throw InvalidUsage(StrCat("captured op ", op.name(), ": unknown kind \"", op.kind(), "\""));
}

runtime::EagerOp AsEager(const proto::CapturedOp& op, EagerKind kind) {
  runtime::EagerOp e;
  e.kind = kind;
  e.matmul = {op.batch(), op.m(), op.k(), op.n()};
  e.fp32 = op.fp32();
  e.elements = op.elements();
  e.inputs = std::clamp(op.inputs(), 1, 3);
  e.bytes_in = op.bytes_in();
  e.bytes_out = op.bytes_out();
  return e;
}

const char* EngineOf(EagerKind kind) {
  switch (kind) {
    case EagerKind::kView:
      return "";
    case EagerKind::kMatmul:
      return "tensor";
    case EagerKind::kScalar:
      return "scalar";
    case EagerKind::kCopy:
      return "dma";
    case EagerKind::kFallback:
      return "host";  // a CPU fallback: the link, the host's kernel, the sync
    default:
      return "vector";
  }
}

// One [m, k] x [k, n] product on the tensor engine in a compiled graph.
double CompiledMatmulUs(const CostModel& model, std::int64_t m, std::int64_t k,
                        std::int64_t n, bool fp32, const PricingOptions& options) {
  const runtime::MatmulCost mm = model.Matmul(m, k, n, fp32);
  const double ghz = model.device().spec().tensor().clock_ghz();
  return mm.time.count() + mm.instructions * options.matmul_overhead_cycles / (ghz * 1e3);
}

// The share of a head's query x key blocks attention computes: a causal
// kernel skips the blocks above the diagonal (128 keys a block).
double CausalFraction(const proto::CapturedAttention& a) {
  const double blocks = std::ceil(static_cast<double>(a.key()) / 128.0);
  return a.causal() ? (blocks + 1) / (2 * blocks) : 1.0;
}

// Matmul and attention FLOPs (2 per multiply-add); 0 for other ops.
double Flops(const proto::CapturedOp& op, EagerKind kind) {
  if (op.has_attention()) {
    const auto& a = op.attention();
    return 2.0 * a.query() * a.key() * a.head_dim() * (a.backward() ? 5 : 2) *
           CausalFraction(a) * a.batch_heads();
  }
  if (kind != EagerKind::kMatmul) return 0;
  return 2.0 * std::max<std::int64_t>(op.batch(), 1) * op.m() * op.k() * op.n();
}

// Flash attention (Neuron's kernel): per head, Q K^T and P V on the tensor
// engine over the causal half of the key blocks (plus the diagonal), the
// exponentials on the scalar engine, row maxima and rescaling on the
// vector engine; the engines overlap, so the slowest sets the time, plus
// streaming Q, K, V and O (and their gradients) through HBM. Backward:
// five products (S again, dV, dP, dQ, dK), the exponentials again and two
// vector passes.
double AttentionUs(const proto::CapturedOp& op, const CostModel& model,
                   const PricingOptions& options) {
  const auto& a = op.attention();
  const double fraction = CausalFraction(a);
  const double products = a.backward() ? 5 : 2;
  const double one = CompiledMatmulUs(model, a.query(), a.head_dim(), a.key(), op.fp32(),
                                      options);  // one product's time for one head
  const double tensor = one * products * fraction * a.batch_heads();
  const auto elements = static_cast<std::int64_t>(a.query() * a.key() * fraction);
  const double scalar = model.Elementwise(Engine::kScalar, elements, 1, false).count() *
                        a.batch_heads();
  const double vector = model.Elementwise(Engine::kVector, elements, 1, false).count() *
                        a.batch_heads() * (a.backward() ? 2 : 1);
  const double hbm = model.Hbm(op.bytes_in() + op.bytes_out()).count();
  return std::max({tensor, scalar, vector}) + hbm;
}

double CompiledUs(const proto::CapturedOp& op, EagerKind kind, const CostModel& model,
                  const PricingOptions& options) {
  const double hbm = model.Hbm(op.bytes_in() + op.bytes_out()).count();
  const auto inputs = std::clamp(op.inputs(), 1, 3);
  switch (kind) {
    case EagerKind::kView:
      return 0;
    case EagerKind::kCopy:
      return hbm;
    case EagerKind::kFallback:  // a CPU segment of the graph: as eager's fallback
      return runtime::FallbackParts(model.device(), AsEager(op, kind)).total().count();
    case EagerKind::kMatmul: {
      const double batch = static_cast<double>(std::max<std::int64_t>(op.batch(), 1));
      return std::max(batch * CompiledMatmulUs(model, op.m(), op.k(), op.n(), op.fp32(),
                                               options),
                      hbm);
    }
    case EagerKind::kScalar:
      return std::max(model.Elementwise(Engine::kScalar, op.elements(), inputs, false).count(),
                      hbm);
    default:
      return std::max(model.Elementwise(Engine::kVector, op.elements(), inputs, false).count(),
                      hbm);
  }
}

}  // namespace

Pricing ParsePricing(const std::string& name) {
  if (name == "compiled") return Pricing::kCompiled;
  if (name == "eager") return Pricing::kEager;
  throw InvalidUsage(StrCat("pricing must be \"compiled\" or \"eager\", got \"", name, "\""));
}

const char* Name(Pricing pricing) {
  return pricing == Pricing::kEager ? "eager" : "compiled";
}

OpPrice PriceOp(const proto::CapturedOp& op, const CostModel& model,
                const PricingOptions& options) {
  const EagerKind kind = KindOf(op);
  OpPrice price;
  price.engine = op.has_attention() ? "tensor" : EngineOf(kind);
  price.flops = Flops(op, kind);
  if (options.pricing == Pricing::kEager) {
    price.us = runtime::EagerCost(model, AsEager(op, kind)).count();
  } else {
    price.us = op.has_attention() ? AttentionUs(op, model, options)
                                  : CompiledUs(op, kind, model, options);
  }
  return price;
}

StepCosts PriceStep(const proto::StepCapture& capture, const CostModel& model,
                    const PricingOptions& options, const CollectivePricer& collective) {
  StepCosts costs;
  for (const auto& phase : capture.phases()) {
    PhaseCost& cost = costs[phase.name()];
    for (const auto& step : phase.steps()) {
      if (step.has_collective()) {
        const auto& c = step.collective();
        NEURON_CHECK(c.bytes() >= 0 && std::isfinite(c.bytes()), "phase ", phase.name(),
                     ": a ", c.kind(), " of ", c.bytes(), " bytes");
        NEURON_CHECK(c.axis() == "tp" || c.axis() == "ep", "phase ", phase.name(), ": a ",
                     c.kind(), " on axis '", c.axis(), "' (tp or ep)");
        (c.axis() == "ep" ? cost.ep_collective_us : cost.tp_collective_us) +=
            collective(c.kind(), c.bytes(), c.axis());
        ++cost.collectives;
        continue;
      }
      const OpPrice price = PriceOp(step.op(), model, options);
      cost.flops += price.flops;
      cost.compute_us += price.us;
      if (!price.engine.empty()) cost.engine_us[price.engine] += price.us;
      ++cost.ops;
    }
  }
  return costs;
}

}  // namespace neuron::parallel
