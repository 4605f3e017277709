#include "matrix_replay.h"

#include <algorithm>
#include <vector>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/topology.h"

namespace neuron::launcher {

namespace {

// The median over the steps after the first (the first compiles and warms up).
template <typename Get>
double WarmMedian(const std::vector<runtime::ReplayedStep>& steps, Get get) {
  std::vector<double> v;
  for (std::size_t k = steps.size() > 1 ? 1 : 0; k < steps.size(); ++k) v.push_back(get(steps[k]));
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

proto::RunFigures ReplayFigures(
    const std::vector<runtime::proto::RankTrace>& traces, const ReplayLayout& layout,
    double tokens_per_rank_step) {
  const runtime::Topology topology = layout.topology.empty()
                                         ? runtime::Topology::Default()
                                         : runtime::Topology::FromFile(layout.topology);
  topology.CheckFits(layout.nodes, {static_cast<std::uint32_t>(layout.ranks_per_node)});
  const runtime::FabricModel model(
      topology, runtime::PlaceRanks(topology, std::vector<std::uint32_t>(
                                                  static_cast<std::size_t>(layout.nodes),
                                                  static_cast<std::uint32_t>(layout.ranks_per_node))),
      runtime::DeviceSpec::FromEnvironment());  // the device the live ranks price with
  const runtime::ReplayResult r = runtime::ReplayTraces(traces, model);
  NEURON_CHECK(!r.steps.empty(), "the traces mark no step (step_begin and step_end marks: "
               "torchneuron.fabric.mark)");
  const double step = WarmMedian(r.steps, [](const auto& s) { return s.modelled_us; });
  const double compute = WarmMedian(r.steps, [](const auto& s) { return s.compute_us; });
  const double bubble = WarmMedian(r.steps, [](const auto& s) { return s.message_wait_us; });
  // An expert-parallel trace's replicas hold ep data-parallel ranks each
  // (TraceLayout), and its tp positions ep x tp ranks.
  const double tokens = tokens_per_rank_step * r.dp * r.ep;
  proto::RunFigures f;
  f.set_world(r.world_size);
  f.set_tp(r.tp / r.ep);
  f.set_pp(r.pp);
  f.set_dp(r.dp * r.ep);
  f.set_recorded_world(r.recorded_world_size);
  f.set_steps(static_cast<int>(r.steps.size()));
  f.set_tokens_per_step(tokens);
  f.set_modelled_step_us(step);
  f.set_compute_us(compute);
  f.set_bubble_us(bubble);
  f.set_exposed_comm_us(std::max(0.0, step - compute - bubble));
  f.set_modelled_tokens_per_s(tokens / step * 1e6);
  f.set_modelled_tokens_per_s_per_device(tokens / step * 1e6 / r.world_size);
  for (const auto& [kind, bytes] : r.steps.back().rank0_bytes) {
    (*f.mutable_bytes_per_step())[kind] = static_cast<double>(bytes);
  }
  return f;
}

}  // namespace neuron::launcher
