#include "neuron/runtime/fabric/fabric_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/reduction_rate.h"

namespace neuron::runtime {

namespace {

int CountNodes(const std::vector<ChipPlacement>& placement) {
  std::uint32_t max_node = 0;
  for (const auto& p : placement) max_node = std::max(max_node, p.node);
  return static_cast<int>(max_node) + 1;
}

std::vector<Stage> StagesOf(const Schedule& schedule) {
  if (schedule.stages.empty()) return {Stage{schedule.algorithm, 0, schedule.steps.size()}};
  std::size_t next = 0;
  for (const Stage& stage : schedule.stages) {
    NEURON_CHECK(stage.first_step == next && stage.end_step >= stage.first_step &&
                     stage.end_step <= schedule.steps.size(),
                 "schedule '", schedule.algorithm, "': stage '", stage.name, "' (steps ",
                 stage.first_step, " to ", stage.end_step, ") does not continue the previous "
                 "one (step ", next, ") within its ", schedule.steps.size(), " steps");
    next = stage.end_step;
  }
  NEURON_CHECK(next == schedule.steps.size(), "schedule '", schedule.algorithm,
               "': its stages end at step ", next, " of ", schedule.steps.size());
  return schedule.stages;
}

// The most distinct ranks one rank sends to in `step` (0 when it is empty).
int MostPeers(const Step& step) {
  if (step.transfers.empty()) {  // a mesh: each rank sends to every other
    std::vector<int> ranks = step.mesh;
    std::sort(ranks.begin(), ranks.end());
    const auto distinct = std::unique(ranks.begin(), ranks.end()) - ranks.begin();
    return distinct > 1 ? static_cast<int>(distinct) - 1 : 0;
  }
  std::vector<std::pair<int, int>> pairs;
  ForEachTransfer(step, [&](const Transfer& t) { pairs.emplace_back(t.src, t.dst); });
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  int most = 0;
  for (std::size_t i = 0, run = 0; i < pairs.size(); ++i) {
    run = (i > 0 && pairs[i].first == pairs[i - 1].first) ? run + 1 : 1;
    most = std::max(most, static_cast<int>(run));
  }
  return most;
}

// How many times `step` pays its algorithm's step_us: once per peer when a
// rank's sends go one after another, else once (never for an empty step).
int StepCostCount(const Schedule& schedule, const Step& step) {
  if (Empty(step)) return 0;
  return schedule.serial_sends ? MostPeers(step) : 1;
}

bool Intersect(const std::vector<int>& a, const std::vector<int>& b) {
  auto i = a.begin(), j = b.begin();
  while (i != a.end() && j != b.end()) {
    if (*i == *j) return true;
    if (*i < *j) ++i; else ++j;
  }
  return false;
}

}  // namespace

std::vector<ChipPlacement> PlaceRanks(const Topology& topology,
                                      const std::vector<std::uint32_t>& ranks_per_node) {
  topology.CheckFits(static_cast<std::uint32_t>(ranks_per_node.size()), ranks_per_node);
  std::vector<ChipPlacement> placement;
  for (std::uint32_t node = 0; node < ranks_per_node.size(); ++node) {
    for (std::uint32_t local = 0; local < ranks_per_node[node]; ++local) {
      placement.push_back(topology.Place(node, local));
    }
  }
  return placement;
}

FabricModel::FabricModel(const Topology& topology, std::vector<ChipPlacement> placement,
                         const DeviceSpec& device)
    : topology_(topology),
      placement_(std::move(placement)),
      num_nodes_(CountNodes(placement_)),
      graph_(topology_, static_cast<std::uint32_t>(num_nodes_)),
      calibration_(topology_),
      reduce_bytes_per_second_(ReductionBytesPerSecond(device, CoresPerRank(topology_))) {
  NEURON_CHECK(!placement_.empty(), "fabric model of an empty job");
}

SimulationResult FabricModel::Simulate(const Schedule& schedule) const {
  NEURON_CHECK(schedule.chunks >= 1, "schedule '", schedule.algorithm, "' has ",
               schedule.chunks, " chunks");
  const std::vector<Stage> stages = StagesOf(schedule);
  const double scale = 1.0 / schedule.chunks;
  // Collectives pay the calibrated costs; point-to-point and linear
  // gather / scatter schedules (no kind) only the wire.
  const AlgorithmCosts costs = schedule.kind
                                   ? calibration_.Costs(schedule.algorithm, *schedule.kind)
                                   : AlgorithmCosts{};
  SimulationResult result;
  std::vector<double> stage_us;
  for (const Stage& stage : stages) {
    SimDuration sum{0};
    for (std::size_t i = stage.first_step; i < stage.end_step; ++i) {
      // A repeated step is priced once: the same transfers take the same time.
      double bytes_hops = 0;
      const SimDuration t =
          StepTime(schedule.steps[i], scale, &bytes_hops) +
          SimDuration(costs.step_us * StepCostCount(schedule, schedule.steps[i]));
      for (std::size_t r = 0; r < schedule.steps[i].repeat; ++r) {
        result.steps.push_back(t);
        result.link_bytes += bytes_hops;
        sum += t;
      }
    }
    result.stages.push_back(sum);
    stage_us.push_back(sum.count());
  }
  result.link_bytes *= schedule.chunks;
  if (schedule.chunks == 1) {
    for (const SimDuration t : result.stages) result.total += t;
  } else {
    result.total = SimDuration(PipelineMicros(schedule, stages, stage_us));
  }
  if (schedule.kind && !schedule.steps.empty()) {
    result.total += SimDuration(calibration_.launch_us() + costs.fixed_us);
  }
  return result;
}

std::vector<int> FabricModel::StageResources(const Schedule& schedule, const Stage& stage) const {
  const int links = graph_.num_links();
  std::vector<int> used;
  for (std::size_t i = stage.first_step; i < stage.end_step; ++i) {
    ForEachTransfer(schedule.steps[i], [&](const Transfer& t) {
      const auto a = placement_[t.src].chip, b = placement_[t.dst].chip;
      if (a == b) used.push_back(links + static_cast<int>(a));
      graph_.ForEachLink(static_cast<int>(a), static_cast<int>(b),
                         [&](int id) { used.push_back(id); });
    });
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  return used;
}

double FabricModel::PipelineMicros(const Schedule& schedule, const std::vector<Stage>& stages,
                                   const std::vector<double>& stage_us) const {
  const int k = schedule.chunks;
  const int n = static_cast<int>(stages.size());
  std::vector<std::vector<int>> resources;
  for (const Stage& stage : stages) resources.push_back(StageResources(schedule, stage));
  // conflicts[s]: the stages (s itself included) that cannot overlap s.
  std::vector<std::vector<int>> conflicts(n);
  for (int s = 0; s < n; ++s) {
    for (int o = 0; o < n; ++o) {
      if (o == s || Intersect(resources[s], resources[o])) conflicts[s].push_back(o);
    }
  }
  // Event by event: at each time, every stage whose next chunk has left the
  // previous stage and that conflicts with no running stage starts it,
  // later stages first.
  std::vector<int> next(n, 0);             // the chunk each stage takes next
  std::vector<double> busy_until(n, 0.0);  // the end of each stage's latest chunk
  std::vector<double> left(k, 0.0);        // when chunk c left stage next-1 (0: at start)
  int done = 0;
  double now = 0;
  while (done < n * k) {
    for (bool started = true; started;) {  // again while a zero-length stage frees the next
      started = false;
      for (int s = n - 1; s >= 0; --s) {
        const int c = next[s];
        if (c >= k || (s > 0 && next[s - 1] <= c)) continue;  // nothing to take yet
        bool free = left[c] <= now;
        for (int o : conflicts[s]) free = free && busy_until[o] <= now;
        if (!free) continue;
        busy_until[s] = left[c] = now + stage_us[s];
        ++next[s];
        ++done;
        started = true;
      }
    }
    if (done == n * k) break;
    double next_event = std::numeric_limits<double>::infinity();
    for (int s = 0; s < n; ++s) {
      if (busy_until[s] > now) next_event = std::min(next_event, busy_until[s]);
    }
    NEURON_ASSERT(next_event < std::numeric_limits<double>::infinity(), "pipeline of '",
                  schedule.algorithm, "' stalled");
    now = next_event;
  }
  double total = 0;
  for (double t : busy_until) total = std::max(total, t);
  return total;
}

// Transfers per link: in a table of every link when the step's transfers
// outnumber the fabric's links / 8, else only the links routes cross (a
// step costs what its transfers do, not the size of the fabric).
class LinkCounts {
 public:
  LinkCounts(int links, std::size_t transfers)
      : dense_(static_cast<std::size_t>(links) <= 8 * transfers ? static_cast<std::size_t>(links)
                                                                : 0, 0) {}
  void Add(int id) {
    if (dense_.empty()) {
      ++sparse_[id];
    } else {
      ++dense_[static_cast<std::size_t>(id)];
    }
  }
  int Get(int id) const {
    return dense_.empty() ? sparse_.at(id) : dense_[static_cast<std::size_t>(id)];
  }

 private:
  std::vector<int> dense_;
  std::unordered_map<int, int> sparse_;
};

// What the transfers of one step share: links, chips
// (on-chip copies), reductions per receiving rank, and, when the DMA rate
// is capped, each rank's DMA rings (its sends and receives).
struct FabricModel::StepShares {
  LinkCounts links;
  std::map<std::uint32_t, int> on_chip;
  std::vector<int> reducers;  // per rank: transfers reducing there
  std::vector<int> sends, receives;
};

FabricModel::StepShares FabricModel::CountShares(const Step& step) const {
  const int n = world_size();
  const std::size_t ranks = step.mesh.size();
  StepShares shares{LinkCounts(graph_.num_links(), step.transfers.size() + ranks * ranks), {},
                    std::vector<int>(static_cast<std::size_t>(n), 0), {}, {}};
  const bool capped = std::isfinite(calibration_.rank_dma_bytes_per_second());
  shares.sends.assign(capped ? n : 0, 0);
  shares.receives.assign(capped ? n : 0, 0);
  ForEachTransfer(step, [&](const Transfer& t) {
    NEURON_ASSERT(t.src >= 0 && t.src < n && t.dst >= 0 && t.dst < n,
                  "transfer between ranks ", t.src, " and ", t.dst, " of ", n);
    if (t.reduce) ++shares.reducers[static_cast<std::size_t>(t.dst)];
    if (capped) {
      ++shares.sends[t.src];
      ++shares.receives[t.dst];
    }
    const auto a = placement_[t.src].chip, b = placement_[t.dst].chip;
    if (a == b) {
      ++shares.on_chip[a];
      return;
    }
    graph_.ForEachLink(static_cast<int>(a), static_cast<int>(b),
                       [&](int id) { shares.links.Add(id); });
  });
  return shares;
}

SimDuration FabricModel::TransferTime(const Transfer& t, const StepShares& shares, double scale,
                                      std::vector<int>& route, double* link_bytes) const {
  const auto a = placement_[t.src].chip, b = placement_[t.dst].chip;
  const double bytes = t.bytes * scale;
  SimDuration latency{0};
  double rate = 0;
  if (a == b) {
    const auto& on_chip = topology_.spec().on_chip_link();
    latency = SimDuration(on_chip.latency_us());
    rate = on_chip.bandwidth_gbps() * 1e9 / shares.on_chip.at(a);
  } else {
    route.clear();
    graph_.ForEachLink(static_cast<int>(a), static_cast<int>(b),
                       [&](int id) { route.push_back(id); });
    rate = std::numeric_limits<double>::infinity();
    for (auto id = route.rbegin(); id != route.rend(); ++id) {  // first hop first
      const Hop link = graph_.hop(*id);
      latency += link.latency;
      rate = std::min(rate, link.bytes_per_second / shares.links.Get(*id));
    }
    *link_bytes += bytes * static_cast<double>(route.size());
  }
  if (!shares.sends.empty()) {
    rate = std::min(rate, calibration_.rank_dma_bytes_per_second() /
                              std::max(shares.sends[t.src], shares.receives[t.dst]));
  }
  double seconds = bytes / rate;
  if (t.reduce) {
    const double reduce = bytes / (reduce_bytes_per_second_ / shares.reducers[static_cast<std::size_t>(t.dst)]);
    seconds = (seconds + reduce + std::max(seconds, reduce)) / 2;
  }
  return latency + (bytes > 0 ? SimSeconds(seconds) : SimDuration(0));
}

SimDuration FabricModel::StepTime(const Step& step, double scale, double* link_bytes) const {
  const StepShares shares = CountShares(step);
  SimDuration slowest{0};
  std::vector<int> route;  // reused: one allocation per step at most
  ForEachTransfer(step, [&](const Transfer& t) {
    slowest = std::max(slowest, TransferTime(t, shares, scale, route, link_bytes));
  });
  return slowest;
}

}  // namespace neuron::runtime
