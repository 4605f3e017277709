// A private temporary directory (mkdtemp: 0700, a name no one chose
// before), removed with everything in it when this object goes.
//
// Usage:
//   TempDir dir("neuron-predict");
//   std::ofstream(dir.path() / "batch.tsv") << ...;
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::launcher {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    NEURON_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary directory ",
                 tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace neuron::launcher
