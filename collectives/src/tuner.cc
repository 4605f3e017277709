#include "neuron/collectives/tuner.h"

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace {

constexpr std::size_t kBruckBlockBytes = 4096;

void CheckHierarchy(Algorithm algorithm, const GroupShape& group, const char* op) {
  NEURON_CHECK(
      algorithm != Algorithm::kHierarchical || group.hierarchical, op,
      ": the hierarchical algorithm needs ranks on several hosts, several on one "
      "host at least (automatic transport)");
}

}  // namespace

const char* Name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kBinomialTree: return "binomial_tree";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kRabenseifner: return "rabenseifner";
    case Algorithm::kBruck: return "bruck";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

Algorithm ParseAlgorithm(const std::string& name) {
  std::string known;
  for (auto a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                 Algorithm::kBinomialTree, Algorithm::kDirect, Algorithm::kRabenseifner,
                 Algorithm::kBruck, Algorithm::kHierarchical}) {
    if (name == Name(a)) return a;
    known += (known.empty() ? "" : ", ") + std::string(Name(a));
  }
  NEURON_CHECK(false, "unknown collective algorithm '", name, "' (", known, ")");
}

Tuner::Tuner(std::size_t small_message_bytes)
    : forced_(Algorithm::kAuto), small_message_bytes_(small_message_bytes) {
  if (const auto forced =
          runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kCollectiveAlgorithm)) {
    forced_ = ParseAlgorithm(*forced);  // read once, not on every call
  }
}

Algorithm Tuner::AllReduce(Algorithm requested, std::size_t bytes, std::size_t count,
                           const GroupShape& group) const {
  Algorithm algorithm = requested != Algorithm::kAuto ? requested : forced_;
  if (algorithm == Algorithm::kAuto) {
    if (group.hierarchical) {
      algorithm = Algorithm::kHierarchical;
    } else if (group.windows) {
      algorithm = Algorithm::kDirect;
    } else {
      algorithm =
          bytes <= small_message_bytes_ || count < static_cast<std::size_t>(group.size)
              ? Algorithm::kRecursiveDoubling
              : Algorithm::kRing;
    }
  }
  NEURON_CHECK(algorithm != Algorithm::kDirect || group.windows,
               "allreduce: the direct algorithm needs every rank on one host");
  CheckHierarchy(algorithm, group, "allreduce");
  NEURON_CHECK(algorithm != Algorithm::kBinomialTree && algorithm != Algorithm::kBruck,
               "allreduce: algorithm ", Name(algorithm), " does not implement it");
  return algorithm;
}

Algorithm Tuner::AllGather(Algorithm requested, std::size_t block,
                           const GroupShape& group) const {
  Algorithm algorithm = requested;
  if (algorithm == Algorithm::kAuto) {
    algorithm = group.hierarchical          ? Algorithm::kHierarchical
                : block <= kBruckBlockBytes ? Algorithm::kBruck
                                            : Algorithm::kRing;
  }
  NEURON_CHECK(algorithm == Algorithm::kRing || algorithm == Algorithm::kBruck ||
                   algorithm == Algorithm::kHierarchical,
               "allgather: algorithm ", Name(algorithm), " does not implement it");
  CheckHierarchy(algorithm, group, "allgather");
  return algorithm;
}

}  // namespace neuron::collectives
