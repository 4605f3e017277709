#include "neuron/runtime/fabric/collective_names.h"

namespace neuron::runtime {

const char* Name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "allreduce";
    case CollectiveKind::kAllGather: return "allgather";
    case CollectiveKind::kReduceScatter: return "reducescatter";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAllToAll: return "alltoall";
  }
  return "unknown";
}

std::optional<CollectiveKind> ParseCollectiveKind(const std::string& name) {
  for (auto k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                 CollectiveKind::kReduceScatter, CollectiveKind::kBroadcast,
                 CollectiveKind::kReduce, CollectiveKind::kAllToAll}) {
    if (name == Name(k)) return k;
  }
  return std::nullopt;
}

const char* Name(FabricAlgorithm algorithm) {
  switch (algorithm) {
    case FabricAlgorithm::kAuto: return "auto";
    case FabricAlgorithm::kRing: return "ring";
    case FabricAlgorithm::kMesh: return "mesh";
    case FabricAlgorithm::kRdh: return "rdh";
    case FabricAlgorithm::kRecursiveDoubling: return "recursive_doubling";
    case FabricAlgorithm::kHierarchical: return "hierarchical";
    case FabricAlgorithm::kTree: return "tree";
  }
  return "unknown";
}

std::optional<FabricAlgorithm> ParseFabricAlgorithm(const std::string& name) {
  for (auto a : {FabricAlgorithm::kAuto, FabricAlgorithm::kRing, FabricAlgorithm::kMesh,
                 FabricAlgorithm::kRdh, FabricAlgorithm::kRecursiveDoubling,
                 FabricAlgorithm::kHierarchical, FabricAlgorithm::kTree}) {
    if (name == Name(a)) return a;
  }
  return std::nullopt;
}

}  // namespace neuron::runtime
