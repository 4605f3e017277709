#include "neuron/runtime/config.h"

#include <cstdlib>
#include <iterator>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

// Every setting the project reads from the environment: its variable,
// default and help text (each one is documented in docs/configuration.md).
const ConfigEntry kEntries[] = {
    {ConfigKey::kPython, "NEURON_PYTHON", NEURON_DEFAULT_PYTHON,
     "interpreter neuronrun uses for .py scripts (needs torch); default: the "
     "build's",
     false},
    {ConfigKey::kPreload, "NEURON_PRELOAD", "",
     "modules neuronrun imports once and forks each Python rank from (MODULE[,MODULE...], "
     "e.g. torch); set by `neuronrun --preload`; unset or empty: each rank a fresh interpreter",
     false},
    {ConfigKey::kZygoteFd, "NEURON_ZYGOTE_FD", "",
     "descriptor of a connection to a shared zygote that neuronrun forks the Python ranks "
     "from; set by `neuronrun matrix` for its cells' jobs, never seen by a rank",
     false},
    {ConfigKey::kZygote, "NEURON_ZYGOTE", "",
     "socket of a shared zygote (`neuronrun zygote -- COMMAND` sets it for COMMAND): a job "
     "run with --preload forks its Python ranks from there when the zygote imported its "
     "modules with the job's environment",
     false},
    {ConfigKey::kTopologyFile, "NEURON_TOPOLOGY_FILE", "",
     "fabric topology (protobuf text); empty = embedded trn2 node", false},
    {ConfigKey::kNodeIndex, "NEURON_NODE_INDEX", "0",
     "node of the simulated fabric this rank runs on", false},
    {ConfigKey::kChipIndex, "NEURON_CHIP_INDEX", "",
     "global chip index of this rank; empty = rank / ranks per chip", false},
    {ConfigKey::kCoreIndex, "NEURON_CORE_INDEX", "0",
     "logical core of this rank within its chip", false},
    {ConfigKey::kRanksPerChip, "NEURON_RANKS_PER_CHIP", "1",
     "ranks placed on each chip (from the topology)", false},
    {ConfigKey::kStoreEndpoint, "NEURON_STORE_ENDPOINT", "",
     "HOST:PORT of the job's store server (neuronrun's agent)", false},
    {ConfigKey::kJobSecret, "NEURON_JOB_SECRET", "",
     "secret that authenticates a job's store clients", true},
    {ConfigKey::kRdzvSecret, "NEURON_RDZV_SECRET", "",
     "secret shared by the agents of a multi-node job", true},
    {ConfigKey::kCollectiveAlgorithm, "NEURON_CC_ALGO", "",
     "force the host allreduce algorithm: direct, ring, recursive_doubling, "
     "rabenseifner, "
     "hierarchical",
     false},
    {ConfigKey::kFabricAlgorithm, "NEURON_FABRIC_ALGO", "auto",
     "force the fabric model's algorithm where it runs the collective: auto (the "
     "topology's calibrated rule for the kind and size, else the one the model "
     "rates "
     "fastest), ring, mesh, rdh, recursive_doubling, hierarchical, tree",
     false},
    {ConfigKey::kLocalWorldSize, "LOCAL_WORLD_SIZE", "",
     "ranks per node (set by neuronrun); places ranks on the fabric model", false},
    {ConfigKey::kFaults, "NEURON_FAULTS", "",
     "faults added to the topology: faults {...} and rank_delays {...}, text "
     "format",
     false},
    {ConfigKey::kCollectiveDebug, "NEURON_CC_DEBUG", "0",
     "1: every rank compares a fingerprint of every collective with every other "
     "rank's",
     false},
    {ConfigKey::kDeviceFile, "NEURON_DEVICE_FILE", "",
     "device spec (text protobuf) of the simulated NeuronCore; default: the "
     "embedded "
     "NeuronCore-v3",
     false},
    {ConfigKey::kCacheDir, "NEURON_CACHE_DIR", "",
     "directory of the compile cache; default ~/.cache/torchneuron; set but empty: "
     "memory only",
     false},
    {ConfigKey::kCacheExplain, "NEURON_CACHE_EXPLAIN", "0",
     "1: a compile cache miss says which key components differ from the nearest "
     "entry",
     false},
    {ConfigKey::kMasterAddr, "MASTER_ADDR", "",
     "host of the job's rendezvous store (rank 0's; torchrun contract, set by "
     "torchneuron.init under mpirun and srun)",
     false},
    {ConfigKey::kFallbackReport, "NEURON_FALLBACK_REPORT", "0",
     "1: each process records its CPU fallbacks on \"neuron\" (operator, count, modelled "
     "cost, share, source line) from import torchneuron and prints the report to stderr "
     "at exit",
     false},
    {ConfigKey::kFallback, "NEURON_FALLBACK", "1",
     "0: a compiled graph with operators the device does not support is an error "
     "instead "
     "of running on the CPU",
     false},
    {ConfigKey::kSharedTensors, "NEURON_SHARED_TENSORS", "0",
     "1: the neuron backend allocates CPU tensors of 1 MiB or more in memory the "
     "ranks of "
     "a host share, so a large allreduce on them stages nothing",
     false},
    {ConfigKey::kLocalRank, "LOCAL_RANK", "",
     "the rank's index on its node (torchrun contract, set by neuronrun); the "
     "\"neuron\" "
     "device a process starts on",
     false},
    {ConfigKey::kVisibleCores, "NEURON_RT_VISIBLE_CORES", "",
     "the logical NeuronCores of the node this process sees as neuron:0, neuron:1, "
     "...: "
     "a list of indices and ranges, e.g. 0-3 or 0,2,5; default: all of the node's",
     false},
    {ConfigKey::kLogicalCoreConfig, "NEURON_LOGICAL_NC_CONFIG", "",
     "physical NeuronCores per logical core (LNC, 1 or 2); default: the topology's "
     "logical_nc_config (2 on Trainium2)",
     false},
    {ConfigKey::kAgentId, "NEURON_AGENT_ID", "",
     "set by neuronrun for its ranks: the agent that started them (if neuronrun is "
     "killed, its watchdog kills every process whose environment holds it)",
     false},
    {ConfigKey::kCheckpointSecret, "NEURON_CHECKPOINT_SECRET", "",
     "key of sharded checkpoints: saves are authenticated with HMAC-SHA256 under it "
     "and loads trust only checkpoints that carry its MAC",
     true},
    {ConfigKey::kCompileArtifacts, "NEURON_COMPILE_ARTIFACTS", "",
     "1: write each compiled graph's FX graph, IR text, plan and record under the compile "
     "cache's artifacts/ directory; another value: under that directory; unset or 0: none",
     false},
    {ConfigKey::kAdaptiveEager, "NEURON_ADAPTIVE_EAGER", "0",
     "1: eager ops on \"neuron\" are queued into regions that the compiler fuses and "
     "prices at their flush points (a host read, a collective, a sync, a size limit)",
     false},
    {ConfigKey::kAdaptiveEagerMaxOps, "NEURON_ADAPTIVE_EAGER_MAX_OPS", "256",
     "adaptive eager: the ops a region holds at most before it is flushed", false},
};

}  // namespace

ConfigRegistry::ConfigRegistry() : entries_(std::begin(kEntries), std::end(kEntries)) {}

const ConfigRegistry& ConfigRegistry::Get() {
  static const ConfigRegistry registry;
  return registry;
}

const ConfigEntry& ConfigRegistry::entry(ConfigKey key) const {
  for (const auto& e : entries_) {
    if (e.key == key) return e;
  }
  NEURON_ASSERT(false, "config key ", static_cast<int>(key), " not registered");
}

bool ConfigRegistry::IsSet(ConfigKey key) const {
  return std::getenv(entry(key).variable) != nullptr;
}

std::optional<std::string> ConfigRegistry::Find(ConfigKey key) const {
  const ConfigEntry& e = entry(key);
  const char* value = std::getenv(e.variable);
  if (value != nullptr && value[0] != '\0') return std::string(value);
  if (e.default_value[0] != '\0') return std::string(e.default_value);
  return std::nullopt;
}

std::string ConfigRegistry::GetString(ConfigKey key) const {
  return Find(key).value_or("");
}

std::int64_t ConfigRegistry::GetInt(ConfigKey key) const {
  const ConfigEntry& e = entry(key);
  const std::string text = GetString(key);
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  NEURON_CHECK(!text.empty() && end != nullptr && *end == '\0',
               "environment variable ", e.variable, "='", text,
               "' is not an integer");
  return value;
}

const char* VariableName(ConfigKey key) {
  return ConfigRegistry::Get().entry(key).variable;
}

}  // namespace neuron::runtime
