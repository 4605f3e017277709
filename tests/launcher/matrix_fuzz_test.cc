// Fuzzing the scaling-matrix parser: every mutation of the smoke matrix is
// accepted (and expands into cells) or refused with neuron::Error naming the
// file; nothing crashes, overflows or hangs.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "../helpers/mutator.h"
#include "neuron/launcher/matrix.h"
#include "neuron/runtime/files.h"

namespace neuron::launcher {
namespace {

TEST(MatrixFuzz, MutatedMatricesAreAcceptedOrRefused) {
  const std::string seed =
      runtime::ReadFile(std::string(NEURON_SOURCE_DIR) + "/configs/scaling/smoke.textproto",
                        "fuzz seed");
  const std::string path = ::testing::TempDir() + "/matrix_fuzz_" +
                           std::to_string(::getpid()) + ".textproto";
  neuron::testing::Fuzz("scaling matrix", seed, [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    const MatrixSpec spec = LoadMatrix(path);
    // Accepted: a bounded grid.
    EXPECT_LE(spec.cells.size(), 1u << 20);
  });
  std::remove(path.c_str());
}

}  // namespace
}  // namespace neuron::launcher
