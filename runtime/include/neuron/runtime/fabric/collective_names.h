// The collectives and algorithms the fabric model knows, and their names
// (what NEURON_FABRIC_ALGO, traces, tools and topology files spell).
#pragma once

#include <optional>
#include <string>

namespace neuron::runtime {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll };

enum class FabricAlgorithm { kAuto, kRing, kMesh, kRdh, kRecursiveDoubling, kHierarchical, kTree };

// "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall".
const char* Name(CollectiveKind kind);
// "auto", "ring", "mesh", "rdh", "recursive_doubling", "hierarchical", "tree".
const char* Name(FabricAlgorithm algorithm);

// The kind or algorithm Name() calls `name`, or none.
std::optional<CollectiveKind> ParseCollectiveKind(const std::string& name);
std::optional<FabricAlgorithm> ParseFabricAlgorithm(const std::string& name);

// For error messages: "allreduce, allgather, ..., alltoall", and the
// algorithms "ring, mesh, ..., tree" (without "auto").
std::string CollectiveKindNames();
std::string FabricAlgorithmNames();

}  // namespace neuron::runtime
