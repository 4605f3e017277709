#include "neuron/compiler/compiled_graph.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <chrono>

#include "neuron/compiler/graph_runs.h"
#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/lower.h"
#include "neuron/compiler/passes.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::compiler {
namespace {

const runtime::DeviceSpec& Device() {
  static const runtime::DeviceSpec device = runtime::DeviceSpec::FromEnvironment();
  return device;
}

}  // namespace

CompiledGraph::CompiledGraph() : executor_(Device()) {}

CompileCache& CompiledGraph::Cache() {
  static CompileCache cache(CompileCache::Options::FromEnvironment());
  return cache;
}

std::shared_ptr<CompiledGraph> CompiledGraph::Compile(const std::string& ir_text,
                                                      const std::string& options) {
  proto::Graph graph = ParseGraph(ir_text);
  VerifyGraph(graph);
  std::shared_ptr<CompiledGraph> compiled(new CompiledGraph());
  CompiledGraphInfo& info = compiled->info_;
  info.name = graph.name();
  info.nodes_before = graph.nodes_size();
  // The passes, each timed (metrics' pass_us).
  auto timed = [&](const char* name, auto pass) {
    const auto start = std::chrono::steady_clock::now();
    pass(graph);
    info.pass_us.emplace_back(
        name, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count());
  };
  timed("fold_constants", FoldConstants);
  timed("cse", EliminateCommonSubexpressions);
  timed("fold_transposes", FoldTransposes);
  timed("matmul_layouts", FoldTransposesIntoMatmuls);
  timed("dce", EliminateDeadCode);
  VerifyGraph(graph);
  info.nodes_after = graph.nodes_size();
  for (const auto& v : graph.inputs()) info.inputs.push_back(v.name());
  info.outputs.assign(graph.outputs().begin(), graph.outputs().end());
  const CacheKey key = MakeCacheKey(graph, options, Device());
  info.cache_key = key.digest;
  CompileCache::Lookup lookup;
  compiled->executable_ = Cache().GetOrCompile(
      key,
      [&] {
        const auto start = std::chrono::steady_clock::now();
        Lowered lowered = Lower(graph, Device(), key.digest);
        info.pass_us.emplace_back(
            "lower", std::chrono::duration<double, std::micro>(
                         std::chrono::steady_clock::now() - start)
                         .count());
        return std::move(lowered.executable);
      },
      Device(), &lookup);
  info.cache_lookup = CompileCache::Name(lookup.kind);
  info.cache_report = lookup.report;
  info.sbuf_lower_bound = compiled->executable_->sbuf_lower_bound();
  info.psum_lower_bound = compiled->executable_->psum_lower_bound();
  compiled->prepared_ = runtime::Executor::Prepare(*compiled->executable_);
  compiled->timing_ = std::make_shared<const runtime::PlanTiming>(
      runtime::TimePlan(*compiled->executable_, compiled->executor_.model()));
  info.modelled_us = compiled->timing_->total.count();
  info.mfu = compiled->timing_->mfu;
  for (const auto& i : compiled->executable_->instructions()) {
    if (i.op() != runtime::proto::OP_FUSED) continue;
    ++info.fused_groups;
    info.fused_ops += i.fused_size();
  }
  for (int k = 0; k < runtime::kEngineCount; ++k) {
    info.engine_us[k] = compiled->timing_->busy[k].count();
  }
  // The plan's extents, aligned as the planner aligns.
  for (const auto& b : compiled->executable_->buffers()) {
    const std::uint64_t end = (b.offset() + b.bytes() + 63) / 64 * 64;
    if (b.space() == runtime::proto::SBUF) info.sbuf_bytes = std::max(info.sbuf_bytes, end);
    if (b.space() == runtime::proto::PSUM) info.psum_bytes = std::max(info.psum_bytes, end);
    if (b.space() == runtime::proto::HBM) info.hbm_bytes = std::max(info.hbm_bytes, end);
  }
  return compiled;
}

std::vector<runtime::HostTensor> CompiledGraph::Run(
    std::vector<runtime::HostTensor> inputs) {
  std::vector<runtime::HostView> views;
  for (const auto& t : inputs) views.push_back(runtime::HostView::Of(t));
  return Run(views);
}

std::vector<runtime::HostTensor> CompiledGraph::Run(
    const std::vector<runtime::HostView>& inputs) {
  NEURON_CHECK(inputs.size() == info_.inputs.size(), "compiled graph ", info_.name, ": ",
               inputs.size(), " inputs given, it takes ", info_.inputs.size());
  std::map<std::string, runtime::HostView> bound;
  for (std::size_t i = 0; i < inputs.size(); ++i) bound[info_.inputs[i]] = inputs[i];
  // Validated when loaded or compiled; the timeline is the plan's.
  const auto wall_start = std::chrono::steady_clock::now();
  auto outputs = executor_.Compute(prepared_, bound);
  const double wall_us = std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - wall_start)
                             .count();
  std::vector<runtime::HostTensor> out;
  for (std::size_t k = 0; k < info_.outputs.size(); ++k) {
    auto& t = outputs.at(info_.outputs[k]);
    // The last use of a name moves its tensor; an output listed twice is copied.
    const bool again =
        std::find(info_.outputs.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                  info_.outputs.end(), info_.outputs[k]) != info_.outputs.end();
    if (again) {
      out.push_back(t);
    } else {
      out.push_back(std::move(t));
    }
  }
  // The rank's compute stream ran the graph for its modelled time, after
  // the work queued before it (adaptive eager's region).
  runtime::SettlePendingCompute("other");
  const runtime::SimDuration start = runtime::ProcessClock()->compute();
  runtime::ProcessClock()->AdvanceCompute(timing_->total);
  GraphRunLog::Get().Record({info_.name, start, timing_->total, wall_us, timing_});
  std::lock_guard<std::mutex> lock(mutex_);
  ++info_.runs;
  return out;
}

CompiledGraphInfo CompiledGraph::info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return info_;
}

std::string CompiledGraph::PlanText() const {
  runtime::proto::Executable plan = *executable_;
  for (auto& c : *plan.mutable_constants()) {
    c.set_data(StrCat("<", c.data().size(), " bytes>"));
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(plan, &text);
  return text;
}

void CompiledGraph::WriteTimeline(const std::string& path) const {
  runtime::WriteChromeTrace(*timing_, info_.name, path);
}

}  // namespace neuron::compiler
