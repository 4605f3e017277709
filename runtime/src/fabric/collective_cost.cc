#include "neuron/runtime/fabric/collective_cost.h"

#include <utility>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_schedules.h"

namespace neuron::runtime {

namespace {

// Gather (to the root) or scatter (from it): one step, every rank at once.
Schedule Linear(const std::vector<int>& group, int root_index, double bytes, bool to_root) {
  Step step;
  const int root = group[static_cast<std::size_t>(root_index)];
  for (int g : group) {
    if (g == root) continue;
    step.transfers.push_back(to_root ? Transfer{g, root, bytes} : Transfer{root, g, bytes});
  }
  Schedule linear;
  linear.algorithm = "linear";
  linear.steps.push_back(std::move(step));
  return linear;
}

CollectiveKind ParseKind(const std::string& kind) {
  const auto k = ParseCollectiveKind(kind);
  NEURON_CHECK(k.has_value(), "unknown collective '", kind, "' (", CollectiveKindNames(),
               ", gather, scatter)");
  return *k;
}

}  // namespace

CollectiveCost ModelCollective(const FabricModel& model, const std::string& kind, double bytes,
                               const std::vector<int>& group, int root,
                               FabricAlgorithm algorithm) {
  NEURON_CHECK(!group.empty(), "collective '", kind, "' has no ranks");
  NEURON_CHECK(root >= 0 && static_cast<std::size_t>(root) < group.size(), "collective '",
               kind, "': root ", root, " outside its ", group.size(), " ranks");
  Schedule schedule;
  if (kind == "gather" || kind == "scatter") {
    schedule = Linear(group, root, bytes, kind == "gather");
  } else {
    const CollectiveShape shape{ParseKind(kind), bytes, group, root};
    if (algorithm == FabricAlgorithm::kAuto || !Implements(model, algorithm, shape)) {
      ChosenSchedule chosen = AutomaticSchedule(model, shape);
      return {chosen.micros, chosen.schedule.algorithm, chosen.schedule.chunks};
    }
    schedule = BuildSchedule(model, shape, algorithm);
  }
  return {model.Simulate(schedule).total.count(), schedule.algorithm, schedule.chunks};
}

}  // namespace neuron::runtime
