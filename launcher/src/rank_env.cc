#include "rank_env.h"

#include <set>
#include <utility>

#include "neuron/runtime/config.h"

extern char** environ;

namespace neuron::launcher {

using runtime::ConfigKey;
using runtime::VariableName;

Environment CurrentEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

bool IsRankOwnVariable(const std::string& name) {
  return name == "RANK" || name == "LOCAL_RANK" || name == "ROLE_RANK" ||
         name == VariableName(ConfigKey::kChipIndex) || name == VariableName(ConfigKey::kCoreIndex);
}

bool IsJobVariable(const std::string& name) {
  static const std::set<std::string> kJob = {
      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
      "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  static const ConfigKey kNeuron[] = {
      ConfigKey::kNodeIndex, ConfigKey::kRanksPerChip, ConfigKey::kStoreEndpoint,
      ConfigKey::kJobSecret, ConfigKey::kAgentId,     ConfigKey::kRdzvSecret,
      ConfigKey::kPreload,   ConfigKey::kZygoteFd,    ConfigKey::kZygote};
  if (kJob.count(name) > 0 || name.rfind("TORCHELASTIC_", 0) == 0) return true;
  for (ConfigKey key : kNeuron) {
    if (name == VariableName(key)) return true;
  }
  return false;
}

bool ShapesImports(const std::string& name) {
  if (IsRankOwnVariable(name) || IsJobVariable(name)) return false;
  if (name == VariableName(ConfigKey::kCacheDir)) return false;
  for (const char* prefix : {"PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  if (name == "LD_PRELOAD" || name == "LD_LIBRARY_PATH") return true;
  for (const auto& entry : runtime::ConfigRegistry::Get().entries()) {
    if (name == entry.variable) return true;
  }
  return false;
}

Environment RankEnvironment(Environment env, const RankIdentity& id) {
  auto set = [&env](const std::string& name, const std::string& value) {
    env[name] = value;
  };
  // The torchrun contract.
  set("RANK", std::to_string(id.global_rank));
  set("LOCAL_RANK", std::to_string(id.local_rank));
  set("WORLD_SIZE", std::to_string(id.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(id.local_world_size));
  set("GROUP_RANK", std::to_string(id.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(id.nnodes));
  set("ROLE_NAME", "default");
  set("ROLE_RANK", std::to_string(id.global_rank));
  set("ROLE_WORLD_SIZE", std::to_string(id.world_size));
  set("MASTER_ADDR", id.master_addr);
  set("MASTER_PORT", std::to_string(id.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(id.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(id.max_restarts));
  set("TORCHELASTIC_RUN_ID", id.run_id);
  // torch's env:// rendezvous: rank 0 hosts the TCPStore on MASTER_PORT.
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  env = InterpreterEnvironment(std::move(env), id.python_path);
  // Placement on the simulated fabric.
  set(VariableName(ConfigKey::kNodeIndex), std::to_string(id.placement.node));
  set(VariableName(ConfigKey::kChipIndex), std::to_string(id.placement.chip));
  set(VariableName(ConfigKey::kCoreIndex), std::to_string(id.placement.core));
  set(VariableName(ConfigKey::kRanksPerChip), std::to_string(id.ranks_per_chip));
  if (id.topology_file.empty()) {
    env.erase(VariableName(ConfigKey::kTopologyFile));
  } else {
    set(VariableName(ConfigKey::kTopologyFile), id.topology_file);
  }
  if (!id.device_file.empty()) set(VariableName(ConfigKey::kDeviceFile), id.device_file);
  set(VariableName(ConfigKey::kStoreEndpoint), id.store_endpoint);
  set(VariableName(ConfigKey::kJobSecret), id.job_secret);
  set(VariableName(ConfigKey::kAgentId), id.agent_id);
  env.erase(VariableName(ConfigKey::kRdzvSecret));
  env.erase(VariableName(ConfigKey::kZygoteFd));  // neuronrun's connection, not the rank's
  return env;
}

Environment InterpreterEnvironment(Environment env, const std::string& python_path) {
  for (const char* name : {"OMP_NUM_THREADS", "PYTHONUNBUFFERED"}) {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) env[name] = "1";
  }
  if (!python_path.empty()) {
    auto it = env.find("PYTHONPATH");
    const std::string old = it == env.end() ? "" : it->second;
    // Once: a process started the same way (neuronrun in a rank, a test
    // under `neuronrun zygote exec`) passes on the same PYTHONPATH.
    if (old != python_path && old.rfind(python_path + ":", 0) != 0) {
      env["PYTHONPATH"] = old.empty() ? python_path : python_path + ":" + old;
    }
  }
  return env;
}

std::vector<std::string> ToEnvp(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

}  // namespace neuron::launcher
