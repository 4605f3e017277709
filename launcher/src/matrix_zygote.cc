#include "matrix_zygote.h"

#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace neuron::launcher {

MatrixZygote::MatrixZygote() {
  const std::string list = SharedZygoteModules();
  if (!list.empty()) modules_ = ParsePreload(list, "NEURON_PRELOAD");
}

int MatrixZygote::Connect(std::ostream& progress) {
  // Under `neuronrun zygote`, the cells' jobs use that one (NEURON_ZYGOTE).
  if (modules_.empty() || failed_ ||
      !runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kZygote).empty()) {
    return -1;
  }
  try {
    if (!zygote_) zygote_ = StartSharedZygote(modules_);
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
