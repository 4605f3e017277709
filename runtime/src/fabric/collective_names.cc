#include "neuron/runtime/fabric/collective_names.h"

#include <utility>

namespace neuron::runtime {

namespace {

// Each enumerator's name, once.
constexpr std::pair<CollectiveKind, const char*> kKinds[] = {
    {CollectiveKind::kAllReduce, "allreduce"},   {CollectiveKind::kAllGather, "allgather"},
    {CollectiveKind::kReduceScatter, "reducescatter"}, {CollectiveKind::kBroadcast, "broadcast"},
    {CollectiveKind::kReduce, "reduce"},         {CollectiveKind::kAllToAll, "alltoall"},
};

constexpr std::pair<FabricAlgorithm, const char*> kAlgorithms[] = {
    {FabricAlgorithm::kAuto, "auto"},
    {FabricAlgorithm::kRing, "ring"},
    {FabricAlgorithm::kMesh, "mesh"},
    {FabricAlgorithm::kRdh, "rdh"},
    {FabricAlgorithm::kRecursiveDoubling, "recursive_doubling"},
    {FabricAlgorithm::kHierarchical, "hierarchical"},
    {FabricAlgorithm::kTree, "tree"},
};

template <typename Table, typename Enum>
const char* NameIn(const Table& table, Enum value) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  return "unknown";
}

template <typename Enum, typename Table>
std::optional<Enum> ParseIn(const Table& table, const std::string& name) {
  for (const auto& [e, n] : table) {
    if (name == n) return e;
  }
  return std::nullopt;
}

template <typename Table>
std::string Join(const Table& table, std::size_t first) {
  std::string out;
  for (std::size_t i = first; i < std::size(table); ++i) {
    if (!out.empty()) out += ", ";
    out += table[i].second;
  }
  return out;
}

}  // namespace

const char* Name(CollectiveKind kind) { return NameIn(kKinds, kind); }

const char* Name(FabricAlgorithm algorithm) { return NameIn(kAlgorithms, algorithm); }

std::optional<CollectiveKind> ParseCollectiveKind(const std::string& name) {
  return ParseIn<CollectiveKind>(kKinds, name);
}

std::optional<FabricAlgorithm> ParseFabricAlgorithm(const std::string& name) {
  return ParseIn<FabricAlgorithm>(kAlgorithms, name);
}

std::string CollectiveKindNames() { return Join(kKinds, 0); }

std::string FabricAlgorithmNames() { return Join(kAlgorithms, 1); }

}  // namespace neuron::runtime
