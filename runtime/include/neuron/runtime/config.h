// The one registry of environment variables the project reads.
//
// Every component asks this registry instead of calling getenv itself, so the
// full list of knobs lives in one table (config.cc), which docs/configuration.md
// mirrors (a test keeps the two in step).
//
// Usage:
//   const auto& reg = neuron::runtime::ConfigRegistry::Get();
//   std::string topo = reg.GetString(neuron::runtime::ConfigKey::kTopologyFile);
//   std::string var = neuron::runtime::VariableName(ConfigKey::kJobSecret);
//
// Values are read from the environment on every call (cheap, and tests may
// change the environment); nothing is cached.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace neuron::runtime {

enum class ConfigKey {
  kPython,               // NEURON_PYTHON
  kPreload,              // NEURON_PRELOAD
  kZygoteFd,             // NEURON_ZYGOTE_FD
  kZygote,               // NEURON_ZYGOTE
  kTopologyFile,         // NEURON_TOPOLOGY_FILE
  kNodeIndex,            // NEURON_NODE_INDEX
  kChipIndex,            // NEURON_CHIP_INDEX
  kCoreIndex,            // NEURON_CORE_INDEX
  kRanksPerChip,         // NEURON_RANKS_PER_CHIP
  kStoreEndpoint,        // NEURON_STORE_ENDPOINT
  kJobSecret,            // NEURON_JOB_SECRET
  kRdzvSecret,           // NEURON_RDZV_SECRET
  kCollectiveAlgorithm,  // NEURON_CC_ALGO
  kFabricAlgorithm,      // NEURON_FABRIC_ALGO
  kLocalWorldSize,       // LOCAL_WORLD_SIZE (torchrun contract)
  kFaults,               // NEURON_FAULTS
  kCollectiveDebug,      // NEURON_CC_DEBUG
  kDeviceFile,           // NEURON_DEVICE_FILE
  kCacheDir,             // NEURON_CACHE_DIR
  kCacheExplain,         // NEURON_CACHE_EXPLAIN
  kFallbackReport,       // NEURON_FALLBACK_REPORT
  kFallback,             // NEURON_FALLBACK
  kMasterAddr,           // MASTER_ADDR (torchrun contract)
  kSharedTensors,        // NEURON_SHARED_TENSORS
  kLocalRank,            // LOCAL_RANK (torchrun contract)
  kVisibleCores,         // NEURON_RT_VISIBLE_CORES
  kLogicalCoreConfig,    // NEURON_LOGICAL_NC_CONFIG
  kAgentId,              // NEURON_AGENT_ID
  kCheckpointSecret,     // NEURON_CHECKPOINT_SECRET
  kCompileArtifacts,     // NEURON_COMPILE_ARTIFACTS
  kAdaptiveEager,        // NEURON_ADAPTIVE_EAGER
  kAdaptiveEagerMaxOps,  // NEURON_ADAPTIVE_EAGER_MAX_OPS
};

struct ConfigEntry {
  ConfigKey key;
  const char* variable;       // environment variable name
  const char* default_value;  // "" when unset means "not given"
  const char* meaning;        // one line, copied into docs/configuration.md
  bool secret;                // never printed or logged
};

class ConfigRegistry {
 public:
  static const ConfigRegistry& Get();

  const std::vector<ConfigEntry>& entries() const { return entries_; }
  const ConfigEntry& entry(ConfigKey key) const;

  // The environment value, or the entry's default when unset or empty.
  std::string GetString(ConfigKey key) const;
  // Like GetString, but nullopt when the variable is unset and has no default.
  std::optional<std::string> Find(ConfigKey key) const;
  // Whether the variable is in the environment at all (set, even empty).
  bool IsSet(ConfigKey key) const;
  // Parses an integer; throws InvalidUsage naming the variable on bad text.
  std::int64_t GetInt(ConfigKey key) const;

 private:
  ConfigRegistry();
  std::vector<ConfigEntry> entries_;
};

// The environment variable behind a key, e.g. "NEURON_TOPOLOGY_FILE".
const char* VariableName(ConfigKey key);

}  // namespace neuron::runtime
