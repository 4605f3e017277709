#include "matrix_zygote.h"

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "rank_env.h"

namespace neuron::launcher {

MatrixZygote::MatrixZygote(const std::string& trainer_modules) {
  const auto& config = runtime::ConfigRegistry::Get();
  const bool set = config.IsSet(runtime::ConfigKey::kPreload);
  const std::string list = set ? config.GetString(runtime::ConfigKey::kPreload) : trainer_modules;
  if (!list.empty()) modules_ = ParsePreload(list, set ? "NEURON_PRELOAD" : "the trainers' modules");
}

int MatrixZygote::Connect(std::ostream& progress) {
  // Under `neuronrun zygote`, the cells' jobs use that one (NEURON_ZYGOTE).
  if (modules_.empty() || failed_ ||
      !runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kZygote).empty()) {
    return -1;
  }
  try {
    if (!zygote_) {
      const std::string python =
          ResolveProgram(runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPython));
      NEURON_CHECK(!python.empty(), "no python interpreter (NEURON_PYTHON)");
      Environment env = InterpreterEnvironment(CurrentEnvironment(), NEURON_PYTHON_PACKAGE_DIR);
      // As a rank of a cell without a topology sees it (rank_env.cc): the
      // devices torchneuron finds at import are the embedded topology's.
      env.erase(runtime::VariableName(runtime::ConfigKey::kZygoteFd));
      env.erase(runtime::VariableName(runtime::ConfigKey::kTopologyFile));
      zygote_ = std::make_unique<Zygote>(python, ToEnvp(env), modules_);
    }
    return zygote_->Connect();
  } catch (const Error& e) {
    zygote_.reset();
    failed_ = true;
    progress << "neuronrun matrix: " << e.what()
             << "; each cell's ranks fork from a zygote of its own" << std::endl;
    return -1;
  }
}

}  // namespace neuron::launcher
