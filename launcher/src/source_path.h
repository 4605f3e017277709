// Where a relative path named in a configuration file (a matrix, a
// prediction table) is found: next to that file, else in the current
// directory, else in the source tree neuronrun was built from.
#pragma once

#include <filesystem>
#include <string>

namespace neuron::launcher {

// `name` itself when absolute or found nowhere (the caller's open then
// names it).
std::filesystem::path ResolveNear(const std::string& name, const std::string& config_path);

}  // namespace neuron::launcher
