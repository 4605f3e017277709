// The modelled time of a captured training step's phases on the simulated
// NeuronCore (docs/scaling.md, "Predicting a full-size job"): each captured
// operation priced by the device model, each tensor-parallel collective and
// each expert-parallel all-to-all by the fabric model (a caller's pricer,
// for the group's placement: layout_collectives.h).
//
// Two pricings of the same operations:
//   eager     each op as the eager "neuron" device charges it
//             (runtime::EagerCost: its own DMA's fixed cost, then the larger
//             of its engine time and its HBM traffic): a prediction of an
//             eager job, equal to the replay of one run for real;
//   compiled  each op as a compiled graph runs it: its DMAs pipelined (no
//             fixed cost per op), the larger of its engine time and its HBM
//             traffic; matmuls on the tensor engine's tiles with
//             `matmul_overhead_cycles` more per instruction (the one
//             constant fitted to a published figure: docs/scaling.md);
//             attention as a flash-attention kernel whose tensor, scalar
//             and vector engines overlap (the slowest sets the time).
//
// Usage:
//   StepCosts costs = PriceStep(capture, CostModel(spec), {}, pricer);
//   costs.at("layer_forward").total_us()
#pragma once

#include <functional>
#include <map>
#include <string>

#include "neuron/parallel/step_capture.pb.h"
#include "neuron/runtime/device/cost_model.h"

namespace neuron::parallel {

enum class Pricing { kCompiled, kEager };
Pricing ParsePricing(const std::string& name);  // "compiled" | "eager"
const char* Name(Pricing pricing);

struct PricingOptions {
  Pricing pricing = Pricing::kCompiled;
  // Tensor-engine cycles each matmul instruction costs beyond its issue
  // interval in a compiled graph (stationary loads, PSUM traffic).
  double matmul_overhead_cycles = 0;
};

// One phase's modelled time on one rank.
struct PhaseCost {
  std::map<std::string, double> engine_us;  // by the engine each op runs on
  double compute_us = 0;                     // every op's time, in program order
  double tp_collective_us = 0;               // its blocking tensor-parallel collectives
  double ep_collective_us = 0;               // its blocking expert-parallel all-to-alls
  double flops = 0;                          // matmul and attention FLOPs it executes
  int ops = 0;
  int collectives = 0;
  double total_us() const { return compute_us + tp_collective_us + ep_collective_us; }
};

using StepCosts = std::map<std::string, PhaseCost>;

// Microseconds of one collective of `kind` and `bytes` over `axis` ("tp" or
// "ep").
using CollectivePricer =
    std::function<double(const std::string& kind, double bytes, const std::string& axis)>;

struct OpPrice {
  double us = 0;
  std::string engine;  // "tensor", "vector", "scalar", "dma", "host" (a CPU fallback),
                       // or "" for a view
  double flops = 0;    // matmul and attention FLOPs
};

// One op under `options`. InvalidUsage names an op of an unknown kind or
// with negative sizes.
OpPrice PriceOp(const proto::CapturedOp& op, const runtime::CostModel& model,
                const PricingOptions& options);

// Every phase of `capture`; InvalidUsage names a collective of negative or
// non-finite bytes, or on an axis other than "tp" and "ep".
StepCosts PriceStep(const proto::StepCapture& capture, const runtime::CostModel& model,
                    const PricingOptions& options, const CollectivePricer& collective);

}  // namespace neuron::parallel
