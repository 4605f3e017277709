#include "rank_env.h"

#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "exit_status.h"

namespace neuron::launcher {
namespace {

RankIdentity Identity() {
  RankIdentity id;
  id.global_rank = 5;
  id.local_rank = 1;
  id.world_size = 8;
  id.local_world_size = 4;
  id.node_rank = 1;
  id.nnodes = 2;
  id.restart_count = 2;
  id.max_restarts = 3;
  id.run_id = "job";
  id.master_addr = "10.0.0.1";
  id.master_port = 4567;
  id.placement = {1, 17, 0};
  id.store_endpoint = "10.0.0.1:29400";
  id.job_secret = "s3cret";
  id.agent_id = "0123abcd";
  id.python_path = "/src/python";
  return id;
}

TEST(RankEnvironment, CarriesTheTorchrunContract) {
  const auto env = RankEnvironment({{"PATH", "/bin"}}, Identity());
  EXPECT_EQ(env.at("RANK"), "5");
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(env.at("WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("GROUP_RANK"), "1");
  EXPECT_EQ(env.at("ROLE_RANK"), "5");
  EXPECT_EQ(env.at("ROLE_WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT"), "4567");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "job");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(env.at("NEURON_CHIP_INDEX"), "17");
  EXPECT_EQ(env.at("NEURON_NODE_INDEX"), "1");
  EXPECT_EQ(env.at("NEURON_JOB_SECRET"), "s3cret");
  EXPECT_EQ(env.at("NEURON_AGENT_ID"), "0123abcd");
  EXPECT_EQ(env.at("PATH"), "/bin");
  EXPECT_EQ(env.at("PYTHONPATH"), "/src/python");
}

TEST(RankEnvironment, RespectsUserSettingsButNotStaleRanks) {
  const auto env = RankEnvironment({{"OMP_NUM_THREADS", "4"},
                                    {"RANK", "99"},
                                    {"PYTHONPATH", "/mine"},
                                    {"NEURON_RDZV_SECRET", "agents-only"}},
                                   Identity());
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(env.at("RANK"), "5");
  EXPECT_EQ(env.at("PYTHONPATH"), "/src/python:/mine");
  EXPECT_EQ(env.count("NEURON_RDZV_SECRET"), 0u);
}

TEST(RankEnvironment, PutsThePackageFirstOnPythonPathOnce) {
  // A rank's PYTHONPATH passed on (neuronrun in a rank): unchanged.
  EXPECT_EQ(InterpreterEnvironment({{"PYTHONPATH", "/src/python:/mine"}}, "/src/python")
                .at("PYTHONPATH"),
            "/src/python:/mine");
  EXPECT_EQ(InterpreterEnvironment({{"PYTHONPATH", "/src/python"}}, "/src/python").at("PYTHONPATH"),
            "/src/python");
  EXPECT_EQ(InterpreterEnvironment({{"PYTHONPATH", "/src/python2"}}, "/src/python")
                .at("PYTHONPATH"),
            "/src/python:/src/python2");
}

TEST(ZygoteEnvironment, TheVariablesThatShapeImportsAreCompared) {
  for (const char* name : {"PYTHONPATH", "TORCH_LOGS", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                           "OMP_NUM_THREADS", "LD_PRELOAD", "NEURON_TOPOLOGY_FILE",
                           "NEURON_RT_VISIBLE_CORES", "NEURON_FALLBACK_REPORT"}) {
    EXPECT_TRUE(ShapesImports(name)) << name;
  }
  // A job's or rank's own, neuronrun's own, read after import, or nobody's.
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                           "NEURON_STORE_ENDPOINT", "NEURON_CHIP_INDEX", "NEURON_PRELOAD",
                           "NEURON_ZYGOTE", "NEURON_CACHE_DIR", "HOME", "PYTEST_CURRENT_TEST"}) {
    EXPECT_FALSE(ShapesImports(name)) << name;
  }
}

TEST(ExitStatus, DescribesCodesAndSignals) {
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  const int exited3 = 3 << 8;  // as waitpid reports exit(3)
  EXPECT_EQ(ShellExitCode(exited3), 3);
  EXPECT_EQ(DescribeExit(exited3, false), "exited with code 3");
  EXPECT_EQ(ShellExitCode(SIGKILL), 137);
  EXPECT_EQ(DescribeExit(SIGKILL, false),
            "was killed by SIGKILL (signal 9) from outside, possibly out of memory");
  EXPECT_EQ(DescribeExit(SIGKILL, true), "was killed by SIGKILL (signal 9)");
  EXPECT_EQ(DescribeExit(SIGSEGV, false), "was killed by SIGSEGV (signal 11)");
}

}  // namespace
}  // namespace neuron::launcher
