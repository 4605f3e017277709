// The environment each rank starts with: neuronrun's own environment, then
// the torchrun contract (../shared/REFERENCE.md) and the NEURON_* placement
// variables on top. Variable names come from the runtime's config registry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "neuron/runtime/topology.h"

namespace neuron::launcher {

struct RankIdentity {
  std::uint32_t global_rank = 0;
  std::uint32_t local_rank = 0;
  std::uint32_t world_size = 1;
  std::uint32_t local_world_size = 1;
  std::uint32_t node_rank = 0;
  std::uint32_t nnodes = 1;
  std::uint32_t restart_count = 0;
  std::uint32_t max_restarts = 0;
  std::string run_id;
  std::string master_addr;
  std::uint16_t master_port = 0;
  runtime::ChipPlacement placement;
  std::uint32_t ranks_per_chip = 1;
  std::string topology_file;   // absolute; empty = embedded default
  std::string device_file;     // absolute; empty = as the environment has it
  std::string store_endpoint;  // HOST:PORT of the job's store server
  std::string job_secret;
  std::string agent_id;        // NEURON_AGENT_ID (ProcessGuard::agent_id)
  std::string python_path;     // prepended to PYTHONPATH when not empty
};

using Environment = std::map<std::string, std::string>;

// The current process environment as a map.
Environment CurrentEnvironment();

// `base` with the rank's variables set. Torchrun's variables always take the
// rank's values; OMP_NUM_THREADS and PYTHONUNBUFFERED only when unset
// (InterpreterEnvironment); the agents' rendezvous secret and neuronrun's
// zygote connection are removed.
Environment RankEnvironment(Environment base, const RankIdentity& id);

// `env` as any Python interpreter neuronrun starts sees it (a rank, a
// zygote): OMP_NUM_THREADS=1 and PYTHONUNBUFFERED=1 when unset, and
// `python_path` (if not empty) first on PYTHONPATH, unless it is already.
Environment InterpreterEnvironment(Environment env, const std::string& python_path);

// The variables RankEnvironment gives each rank of a node its own value
// (RANK, LOCAL_RANK, ROLE_RANK, the chip and core indices); every other
// one is the node's or the job's.
bool IsRankOwnVariable(const std::string& name);

// The variables neuronrun sets for a whole job (WORLD_SIZE, MASTER_PORT,
// TORCHELASTIC_*, the job's store and secret, ...) or that only neuronrun
// reads (NEURON_PRELOAD, the zygote's): a job's own, not its node's.
bool IsJobVariable(const std::string& name);

// Whether `name` can change what importing torch and torchneuron does, so
// a zygote serves a job only when the job's value is the one it imported
// with (zygote.h): Python's (PYTHON*), torch's (TORCH*, PYTORCH*), the
// threading libraries' (OMP_*, MKL_*, KMP_*), the loader's (LD_PRELOAD,
// LD_LIBRARY_PATH) and the project's settings (runtime/src/config.cc),
// less the job's and rank's own and NEURON_CACHE_DIR (read when a graph
// compiles).
bool ShapesImports(const std::string& name);

// "NAME=value" entries for execve.
std::vector<std::string> ToEnvp(const Environment& env);

}  // namespace neuron::launcher
