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
// lowering; an op outside the table is InvalidUsage naming the node.
void LowerNode(LoweringContext& cx, int i, const proto::Node& n) {
  const std::string where = Where(cx.graph(), i, n);
  const NativeOp* op = FindNativeOp(n.op());
  NEURON_CHECK(op != nullptr, where, ": is not supported on the device");
  const std::string source = n.source().empty() ? n.op() : n.source();
  std::vector<std::string> in;
  for (const auto& name : n.inputs()) in.push_back(cx.OnChip(name));
  op->lower(cx, OpCall{n, in, where, source});
}

// The graph lowered, with its epilogues tiled when `tile_epilogues`;
// `*tiled` counts the steps split.
Lowered LowerSteps(const proto::Graph& graph, const runtime::DeviceSpec& device,
                   const std::string& graph_id, bool tile_epilogues, int* tiled) {
  LoweringContext cx(graph, device);
  for (const auto& v : graph.inputs()) cx.AddHbm(v, "input");
  for (const auto& c : graph.constants()) cx.AddHbm(c.value(), "constant");
  for (int i = 0; i < graph.nodes_size(); ++i) LowerNode(cx, i, graph.nodes(i));
  for (const auto& out : graph.outputs()) cx.Store(out);
  for (auto& step : cx.steps()) {  // from here on, views are the slots they view
    for (auto& r : step.reads) r = cx.Root(r);
    for (auto& w : step.writes) w = cx.Root(w);
  }
  ComposeStridedCopies(cx);
  FuseElementwise(cx);
  if (tile_epilogues) *tiled = TileEpilogues(cx);
  Lowered out = Emit(cx, graph_id);
  out.schedule = ScheduleInstructions(out.executable, runtime::CostModel(device));
  return out;
}

}  // namespace

Lowered Lower(const proto::Graph& graph, const runtime::DeviceSpec& device,
              const std::string& graph_id) {
  VerifyGraph(graph);
  int tiled = -1;  // unknown until the pass has run
  std::optional<Lowered> with_tiles;
  try {
    with_tiles = LowerSteps(graph, device, graph_id, true, &tiled);
  } catch (const InvalidUsage&) {
    if (tiled == 0) throw;  // the pass changed nothing: the error is the graph's
  }
  if (tiled == 0) return std::move(*with_tiles);
  // Tiled epilogues overlap the matmuls, but their results are written in
  // parts, which spilling never moves, and their inputs are loaded
  // earlier: where SBUF is tight the plan can be slower or not fit. The
  // model decides; a plan that fails either way is the other's, and a
  // graph that fails both ways fails as it does without the pass.
  std::optional<Lowered> without;
  try {
    without = LowerSteps(graph, device, graph_id, false, &tiled);
  } catch (const InvalidUsage&) {
    if (!with_tiles) throw;
  }
  if (with_tiles &&
      (!without || with_tiles->schedule.after_us < without->schedule.after_us))
    return std::move(*with_tiles);
  return std::move(*without);
}

}  // namespace neuron::compiler
