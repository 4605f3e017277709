#include "neuron/runtime/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

TEST(ConfigRegistry, DefaultsApplyWhenUnset) {
  ::unsetenv("NEURON_PYTHON");
  EXPECT_EQ(ConfigRegistry::Get().GetString(ConfigKey::kPython), NEURON_DEFAULT_PYTHON);
  ::unsetenv("NEURON_TOPOLOGY_FILE");
  EXPECT_FALSE(ConfigRegistry::Get().Find(ConfigKey::kTopologyFile).has_value());
}

TEST(ConfigRegistry, EnvironmentOverridesDefault) {
  ::setenv("NEURON_RANKS_PER_CHIP", "4", 1);
  EXPECT_EQ(ConfigRegistry::Get().GetInt(ConfigKey::kRanksPerChip), 4);
  ::unsetenv("NEURON_RANKS_PER_CHIP");
  EXPECT_EQ(ConfigRegistry::Get().GetInt(ConfigKey::kRanksPerChip), 1);
}

TEST(ConfigRegistry, BadIntegerNamesTheVariable) {
  ::setenv("NEURON_CORE_INDEX", "two", 1);
  try {
    ConfigRegistry::Get().GetInt(ConfigKey::kCoreIndex);
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("NEURON_CORE_INDEX='two'"), std::string::npos)
        << e.what();
  }
  ::unsetenv("NEURON_CORE_INDEX");
}

TEST(ConfigRegistry, EveryVariableIsDocumented) {
  std::ifstream doc(NEURON_SOURCE_DIR "/docs/configuration.md");
  ASSERT_TRUE(doc.good());
  std::stringstream text;
  text << doc.rdbuf();
  for (const auto& e : ConfigRegistry::Get().entries()) {
    EXPECT_NE(text.str().find(std::string("`") + e.variable + "`"), std::string::npos)
        << e.variable << " is missing from docs/configuration.md";
  }
}

}  // namespace
}  // namespace neuron::runtime
