// A graph compiled for the simulated NeuronCore and ready to run: the
// pipeline from IR text to executable (verify, constant folding, CSE, DCE,
// lowering, through the process's compile cache) and the executor.
//
// Usage:
//   auto g = CompiledGraph::Compile(ir_text, /*options=*/"");
//   std::vector<runtime::HostTensor> out = g->Run(inputs);   // graph input order
//   g->info().modelled_us;  g->info().cache_key;
//
// Each run advances the process's simulated compute stream
// (runtime::ProcessClock) by the plan's modelled time and is recorded in
// GraphRunLog (graph_runs.h) for profiles. Errors (unsupported
// ops, dtypes, sizes) are InvalidUsage naming the node.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "neuron/compiler/compile_cache.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/device/plan_timing.h"

namespace neuron::compiler {

struct CompiledGraphInfo {
  std::string name;
  std::string cache_key;
  std::string cache_lookup;  // "memory hit", "disk hit" or "compiled"
  // Why the cache compiled (NEURON_CACHE_EXPLAIN=1: the key components that
  // differ from the nearest entry) or what it found damaged; "" otherwise.
  std::string cache_report;
  int nodes_before = 0;          // as captured
  int nodes_after = 0;           // after the passes
  std::uint64_t sbuf_bytes = 0;  // the plan's SBUF extent
  std::uint64_t sbuf_lower_bound = 0;  // the memory plan's bound (kept in the executable)
  std::uint64_t psum_bytes = 0;        // the plan's PSUM extent ...
  std::uint64_t psum_lower_bound = 0;  // ... and its lower bound
  std::uint64_t hbm_bytes = 0;         // inputs, constants, outputs in HBM
  // Wall microseconds of each pass of this compile, in order ("lower" only
  // on a cache miss).
  std::vector<std::pair<std::string, double>> pass_us;
  // Modelled busy microseconds per engine (runtime::Engine order: tensor,
  // vector, scalar, gpsimd, dma).
  std::array<double, runtime::kEngineCount> engine_us{};
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  int fused_groups = 0;    // fused elementwise chains in the plan ...
  int fused_ops = 0;       // ... and the ops they hold
  double modelled_us = 0;  // of the last run
  double mfu = 0;          // of the last run
  std::uint64_t runs = 0;
};

class CompiledGraph {
 public:
  static std::shared_ptr<CompiledGraph> Compile(const std::string& ir_text,
                                                const std::string& options);
  // Inputs in the graph's input order; outputs in its output order.
  std::vector<runtime::HostTensor> Run(std::vector<runtime::HostTensor> inputs);
  // The same over views of the inputs (HostView: valid until it returns).
  std::vector<runtime::HostTensor> Run(const std::vector<runtime::HostView>& inputs);
  CompiledGraphInfo info() const;
  // The plan's modelled timeline as a Chrome trace (chrome://tracing,
  // Perfetto): one track per engine; IoError names the path.
  void WriteTimeline(const std::string& path) const;
  // The plan as protobuf text (runtime/proto executable.proto), each
  // constant's bytes replaced by their count: what the artifacts hold.
  std::string PlanText() const;
  // The process's compile cache (NEURON_CACHE_DIR, NEURON_CACHE_EXPLAIN).
  static CompileCache& Cache();

 private:
  CompiledGraph();
  std::shared_ptr<const runtime::proto::Executable> executable_;
  runtime::PreparedPlan prepared_;  // of *executable_, for every run
  runtime::Executor executor_;
  // Of every run: the plan's, input-independent (shared with GraphRunLog).
  std::shared_ptr<const runtime::PlanTiming> timing_;
  CompiledGraphInfo info_;
  mutable std::mutex mutex_;
};

}  // namespace neuron::compiler
