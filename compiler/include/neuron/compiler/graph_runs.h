// The runs of compiled graphs in this process, for profiles: each run's
// place on the rank's simulated compute clock, its modelled and wall time,
// and its plan's engine timeline (the same for every run of a graph, so
// shared, not copied).
//
// Usage:
//   GraphRunLog::Get().Record({name, start, modelled, wall_us, timing});   // CompiledGraph::Run
//   for (const GraphRun& r : GraphRunLog::Get().Runs()) ...                 // oldest first
//
// Holds the latest kCapacity runs; total() counts every run since Reset().
#pragma once

#include <cstdint>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "neuron/runtime/device/plan_timing.h"
#include "neuron/runtime/sim_time.h"

namespace neuron::compiler {

struct GraphRun {
  std::string name;                 // the graph's ("GPT_1_forward")
  runtime::SimDuration start{0};    // the compute clock when it was issued
  runtime::SimDuration modelled{0}; // its plan's modelled time
  double wall_us = 0;               // the executor's wall time
  std::shared_ptr<const runtime::PlanTiming> timing;  // engine timeline, from 0
};

class GraphRunLog {
 public:
  static constexpr std::size_t kCapacity = 65536;
  static GraphRunLog& Get();

  // Called with every run as it is recorded, e.g. by torchneuron._C to give
  // torch.profiler's device lane the run (the compiler cannot see the
  // torch-facing device's trace). One observer; null: none.
  using Observer = void (*)(const GraphRun& run);
  static void SetObserver(Observer observer);

  void Record(GraphRun run);
  std::vector<GraphRun> Runs() const;
  std::uint64_t total() const;
  void Reset();

 private:
  mutable std::mutex mutex_;
  std::deque<GraphRun> runs_;
  std::uint64_t total_ = 0;
  inline static std::atomic<Observer> observer_{nullptr};
};

}  // namespace neuron::compiler
