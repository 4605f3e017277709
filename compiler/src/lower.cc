// Lower(): a verified graph's nodes through their rows of the native op
// table (native_ops.h) into device steps, then composed strided copies
// (compose_copies.h), fusion (fusion.h), epilogue
// tiles (epilogue_tiles.h) and emission with spilling (emit.h), then the
// schedule (schedule.h).
#include "neuron/compiler/lower.h"

#include <optional>
#include <string>
#include <vector>

#include "compose_copies.h"
#include "emit.h"
#include "epilogue_tiles.h"
#include "fusion.h"
#include "lower_custom.h"
#include "lowering_context.h"
#include "neuron/compiler/native_ops.h"
#include "neuron/compiler/passes.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {
namespace {

// "graph G: node I (op) from SOURCE": what errors name.
std::string Where(const proto::Graph& g, int i, const proto::Node& n) {
  return StrCat("graph ", g.name(), ": node ", i, " (", n.op(), ")",
                n.source().empty() ? "" : " from " + n.source());
}

// Node `i` as device steps: its inputs loaded on chip, then its op's
// lowering; a custom kernel over HBM (lower_custom.h); an op outside the
// table is InvalidUsage naming the node.
void LowerNode(LoweringContext& cx, int i, const proto::Node& n) {
  const std::string where = Where(cx.graph(), i, n);
  if (n.op() == kCustomKernelOp) return LowerCustomKernel(cx, n, where);  // reads HBM
  const NativeOp* op = FindNativeOp(n.op());
  NEURON_CHECK(op != nullptr, where, ": is not supported on the device (",
               NotNativeReason(n.op()), ")");
  const std::string source = n.source().empty() ? n.op() : n.source();
  std::vector<std::string> in;
  for (const auto& name : n.inputs()) in.push_back(cx.OnChip(name));
  op->lower(cx, OpCall{n, in, where, source});
}

// How LowerSteps lowers: with copies composed, epilogues tiled; what the
// passes did (-1 until they have run).
struct Choices {
  bool compose = true, tile_epilogues = true;
  int composed = -1, tiled = -1;
};

// The graph lowered as `choices` say.
Lowered LowerSteps(const proto::Graph& graph, const runtime::DeviceSpec& device,
                   const std::string& graph_id, Choices& choices) {
  LoweringContext cx(graph, device);
  for (const auto& v : graph.inputs()) cx.AddHbm(v, "input");
  for (const auto& c : graph.constants()) cx.AddHbm(c.value(), "constant");
  for (int i = 0; i < graph.nodes_size(); ++i) LowerNode(cx, i, graph.nodes(i));
  for (const auto& out : graph.outputs()) cx.Store(out);
  for (auto& step : cx.steps()) {  // from here on, views are the slots they view
    for (auto& r : step.reads) r = cx.Root(r);
    for (auto& w : step.writes) w = cx.Root(w);
  }
  if (choices.compose) choices.composed = ComposeStridedCopies(cx);
  FuseElementwise(cx);
  if (choices.tile_epilogues) choices.tiled = TileEpilogues(cx);
  Lowered out = Emit(cx, graph_id);
  out.schedule = ScheduleInstructions(out.executable, runtime::CostModel(device));
  return out;
}

// The graph lowered with epilogues tiled and not (when the pass tiles
// any), the faster plan kept.
Lowered LowerFaster(const proto::Graph& graph, const runtime::DeviceSpec& device,
                    const std::string& graph_id, Choices& choices) {
  std::optional<Lowered> with_tiles;
  try {
    with_tiles = LowerSteps(graph, device, graph_id, choices);
  } catch (const InvalidUsage&) {
    if (choices.tiled == 0) throw;  // the pass changed nothing: the error is the graph's
  }
  if (choices.tiled == 0) return std::move(*with_tiles);
  // Tiled epilogues overlap the matmuls, but their results are written in
  // parts, which spilling never moves, and their inputs are loaded
  // earlier: where SBUF is tight the plan can be slower or not fit. The
  // model decides; a plan that fails either way is the other's, and a
  // graph that fails both ways fails as it does without the pass.
  std::optional<Lowered> without;
  choices.tile_epilogues = false;
  try {
    without = LowerSteps(graph, device, graph_id, choices);
  } catch (const InvalidUsage&) {
    if (!with_tiles) throw;
  }
  if (with_tiles &&
      (!without || with_tiles->schedule.after_us < without->schedule.after_us))
    return std::move(*with_tiles);
  return std::move(*without);
}

}  // namespace

Lowered Lower(const proto::Graph& graph, const runtime::DeviceSpec& device,
              const std::string& graph_id) {
  VerifyGraph(graph);
  Choices choices;
  try {
    return LowerFaster(graph, device, graph_id, choices);
  } catch (const InvalidUsage&) {
    // A composed value is written by several copies, which spilling never
    // moves, from its first writer on: a graph that fits only by spilling
    // it is lowered without composing.
    if (choices.composed <= 0) throw;
  }
  Choices plain;
  plain.compose = false;
  return LowerFaster(graph, device, graph_id, plain);
}

}  // namespace neuron::compiler
