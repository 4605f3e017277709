#include "source_path.h"

namespace neuron::launcher {

namespace fs = std::filesystem;

fs::path ResolveNear(const std::string& name, const std::string& config_path) {
  const fs::path p(name);
  if (p.is_absolute()) return p;
  for (const fs::path& base : {fs::absolute(config_path).parent_path(), fs::current_path(),
                               fs::path(NEURON_SOURCE_DIR)}) {
    if (fs::exists(base / p)) return fs::absolute(base / p);
  }
  return p;
}

}  // namespace neuron::launcher
