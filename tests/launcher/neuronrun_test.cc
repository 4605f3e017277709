// neuronrun end to end: real process trees, real signals, real rendezvous.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "launcher_process.h"

namespace neuron::launcher::testing {
namespace {

using namespace std::chrono_literals;

const std::string kHelper = RANK_HELPER_PATH;

std::string UniqueRunId(const std::string& name) {
  return name + "-" + std::to_string(::getpid());
}

// "[rank N]: KEY=VALUE" lines -> per rank, per key.
std::map<int, std::map<std::string, std::string>> ParseEnvOutput(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> ranks;
  const std::regex line(R"(^\[rank (\d+)\]: ([A-Z_]+)=(.*)$)");
  for (const auto& l : Lines(out)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) ranks[std::stoi(m[1])][m[2]] = m[3];
  }
  return ranks;
}

TEST(Neuronrun, EveryRankGetsTheLauncherContract) {
  const std::string id = UniqueRunId("env");
  LauncherProcess job({"-n", "4", "--run-id", id, kHelper, "env"});
  ASSERT_EQ(job.Wait(), 0) << job.Stderr();
  const auto ranks = ParseEnvOutput(job.Stdout());
  ASSERT_EQ(ranks.size(), 4u) << job.Stdout();
  const std::string port = ranks.at(0).at("MASTER_PORT");
  EXPECT_NE(port, "29500");  // chosen free, never the fixed default
  for (int r = 0; r < 4; ++r) {
    const auto& env = ranks.at(r);
    EXPECT_EQ(env.at("RANK"), std::to_string(r));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(r));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("GROUP_RANK"), "0");
    EXPECT_EQ(env.at("ROLE_RANK"), std::to_string(r));
    EXPECT_EQ(env.at("ROLE_WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT"), port);
    EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "0");
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), id);
    EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
    EXPECT_EQ(env.at("NEURON_CHIP_INDEX"), std::to_string(r));
    EXPECT_EQ(env.at("NEURON_TOPOLOGY_FILE"), "<unset>");  // embedded default
    EXPECT_EQ(env.at("NEURON_JOB_SECRET").size(), 64u);
    EXPECT_EQ(env.at("NEURON_JOB_SECRET"), ranks.at(0).at("NEURON_JOB_SECRET"));
    EXPECT_EQ(env.at("NEURON_RDZV_SECRET"), "<unset>");
  }
  // The secret is the ranks' to use; neuronrun itself never prints it.
  EXPECT_EQ(job.Stderr().find(ranks.at(0).at("NEURON_JOB_SECRET")), std::string::npos);
}

// --bind-to: ranks pinned to one CPU each (auto: when they fit the CPUs).
TEST(Neuronrun, RanksArePinnedToCpusWhenTheyFitOrWhenAsked) {
  auto allowed = [](std::vector<std::string> args) {
    args.insert(args.end(), {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"});
    LauncherProcess job(args);
    EXPECT_EQ(job.Wait(), 0) << job.Stderr();
    std::map<std::string, std::string> by_rank;
    std::istringstream in(job.Stdout());
    std::string line;
    while (std::getline(in, line)) {
      const auto colon = line.find("]:");
      const auto tab = line.rfind('\t');
      if (colon != std::string::npos && tab != std::string::npos) {
        by_rank[line.substr(0, colon + 1)] = line.substr(tab + 1);
      }
    }
    return by_rank;
  };
  const unsigned cpus = std::thread::hardware_concurrency();
  const auto pinned = allowed({"-n", "2", "--bind-to", "core"});
  ASSERT_EQ(pinned.size(), 2u);
  for (const auto& [rank, list] : pinned) {
    EXPECT_EQ(list.find_first_of(",-"), std::string::npos) << rank << " runs on " << list;
  }
  if (cpus >= 2) {
    EXPECT_NE(pinned.at("[rank 0]"), pinned.at("[rank 1]"));
  }
  // More ranks than CPUs (auto) and no binding: every rank may run anywhere.
  const auto free = allowed({"-n", std::to_string(cpus + 1), "--bind-to", "auto"});
  EXPECT_EQ(free.size(), cpus + 1);
  const auto unbound = allowed({"-n", "1", "--bind-to", "none"});
  EXPECT_EQ(unbound.size(), 1u);
  for (const auto* ranks : {&free, &unbound}) {
    for (const auto& [rank, list] : *ranks) {
      if (cpus > 1) {
        EXPECT_NE(list.find_first_of(",-"), std::string::npos) << rank << ": " << list;
      }
    }
  }
}

TEST(Neuronrun, UserSettingsAndTopologyPlacement) {
  const std::string topo = std::string(NEURON_SOURCE_DIR) +
                           "/configs/topologies/trn2-node-lnc2.textproto";
  const std::string device = std::string(NEURON_SOURCE_DIR) +
                             "/configs/devices/neuroncore-v3.textproto";
  LauncherProcess job({"-n", "8", "--topology", topo, "--device", device, kHelper, "env"},
                      {{"OMP_NUM_THREADS", "3"}});
  ASSERT_EQ(job.Wait(), 0) << job.Stderr();
  const auto ranks = ParseEnvOutput(job.Stdout());
  ASSERT_EQ(ranks.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(ranks.at(r).at("OMP_NUM_THREADS"), "3");
    EXPECT_EQ(ranks.at(r).at("NEURON_CHIP_INDEX"), std::to_string(r / 4));
    EXPECT_EQ(ranks.at(r).at("NEURON_CORE_INDEX"), std::to_string(r % 4));
    EXPECT_EQ(ranks.at(r).at("NEURON_RANKS_PER_CHIP"), "4");
    EXPECT_EQ(ranks.at(r).at("NEURON_TOPOLOGY_FILE"), topo);
    EXPECT_EQ(ranks.at(r).at("NEURON_DEVICE_FILE"), device);
  }
}

// A topology whose calibration the ranks' fabric models would reject stops
// the job before any rank starts, in one line naming the file and field.
TEST(Neuronrun, BadCollectiveCalibrationFailsAtLaunch) {
  const std::string path = ::testing::TempDir() + "/bad_calibration.textproto";
  std::ofstream(path) << "name: 'bad-engine' chips_per_node: 16 torus_dims: [4, 4] "
                         "ranks_per_chip: 1 intra_node_link { bandwidth_gbps: 256 } "
                         "inter_node_link { bandwidth_gbps: 25 } on_chip_link { bandwidth_gbps: 2900 } "
                         "collective_engine { calibration { algorithm_rules { algorithm: 'kangaring' } } }\n";
  LauncherProcess job({"-n", "2", "--topology", path, kHelper, "env"});
  EXPECT_EQ(job.Wait(), 2);
  const std::string err = job.Stderr();
  EXPECT_EQ(err.rfind("neuronrun: error: topology " + path +
                          ": collective_engine.calibration.algorithm_rules[0]"
                          ".algorithm names algorithm 'kangaring'",
                      0),
            0u)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(job.Stdout(), "");  // no rank ran the helper
  std::remove(path.c_str());
}

TEST(Neuronrun, ConcurrentOutputArrivesAsWholePrefixedLines) {
  constexpr int kRanks = 8, kLines = 300;
  LauncherProcess job({"-n", std::to_string(kRanks), kHelper, "chatter",
                       std::to_string(kLines)});
  ASSERT_EQ(job.Wait(), 0) << job.Stderr();
  const std::regex whole(R"(^\[rank (\d+)\]: chatter rank=(\d+) line=(\d+) end$)");
  const std::regex last(R"(^\[rank (\d+)\]: no newline at the end from rank (\d+)$)");
  for (const bool is_stderr : {false, true}) {
    std::map<int, int> per_rank;
    for (const auto& l : Lines(is_stderr ? job.Stderr() : job.Stdout())) {
      std::smatch m;
      if (std::regex_match(l, m, whole)) {
        ASSERT_EQ(m[1], m[2]) << "line of one rank under another's prefix: " << l;
        ASSERT_EQ(std::stoi(m[3]) % 2, is_stderr ? 1 : 0) << l;
        ++per_rank[std::stoi(m[1])];
      } else {
        ASSERT_TRUE(!is_stderr && std::regex_match(l, m, last) && m[1] == m[2])
            << "torn or unprefixed line: '" << l << "'";
      }
    }
    ASSERT_EQ(per_rank.size(), static_cast<std::size_t>(kRanks));
    for (const auto& [rank, n] : per_rank) EXPECT_EQ(n, kLines / 2) << "rank " << rank;
  }
}

TEST(Neuronrun, FailingRankEndsTheJobWithItsCodeWithinGrace) {
  const std::string id = UniqueRunId("fail");
  // The other ranks ignore SIGTERM, so only the SIGKILL after the grace
  // period ends them: the worst case of the contract.
  LauncherProcess job({"-n", "4", "--grace-period", "2", "--run-id", id, kHelper,
                       "stubborn", "2", "3"});
  EXPECT_EQ(job.Wait(30s), 3);
  EXPECT_LT(job.ElapsedSeconds(), 0.2 + 2 + 1) << "rank 2 fails at 0.2 s, grace 2 s";
  EXPECT_GE(job.ElapsedSeconds(), 2.0);
  const std::string err = job.Stderr();
  EXPECT_NE(err.find("job failed: rank 2 (node 0"), std::string::npos) << err;
  EXPECT_NE(err.find("exited with code 3"), std::string::npos) << err;
  EXPECT_NE(err.find("neuronrun:   rank helper failing on purpose"), std::string::npos)
      << err;
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(Neuronrun, ASignalDuringTheGracePeriodKeepsTheFailureAndDoesNotRestart) {
  const std::string id = UniqueRunId("graceint");
  LauncherProcess job({"-n", "2", "--grace-period", "30", "--max-restarts", "2",
                       "--run-id", id, kHelper, "stubborn", "1", "3"});
  // Both ranks up, then rank 1 gone: rank 0, ignoring SIGTERM, is in its grace.
  for (int i = 0; i < 400 && ProcessesOfJob(id).size() < 2; ++i) {
    std::this_thread::sleep_for(25ms);
  }
  for (int i = 0; i < 400 && ProcessesOfJob(id).size() != 1; ++i) {
    std::this_thread::sleep_for(25ms);
  }
  ASSERT_EQ(ProcessesOfJob(id).size(), 1u);
  std::this_thread::sleep_for(300ms);
  job.Signal(SIGINT);
  EXPECT_EQ(job.Wait(10s), 3);
  EXPECT_LT(job.ElapsedSeconds(), 10.0) << "not the 30 s grace";
  const std::string err = job.Stderr();
  EXPECT_NE(err.find("job failed: rank 1 (node 0"), std::string::npos) << err;
  EXPECT_NE(err.find("SIGINT while stopping: the ranks killed, no restart"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("restarting the job"), std::string::npos) << err;
  EXPECT_EQ(err.find("interrupted by"), std::string::npos) << err;
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(Neuronrun, FirstRankToExitIsTheRootCauseEvenIfItsPipesDrainLast) {
  // Rank 1 fails first but a grandchild keeps its pipes open; the ranks that
  // fail after it, as ranks that lose a peer do, drain at once.
  LauncherProcess job({"-n", "3", kHelper, "cascade", "1", "4"});
  EXPECT_EQ(job.Wait(30s), 4);
  const std::string err = job.Stderr();
  EXPECT_NE(err.find("job failed: rank 1 (node 0"), std::string::npos) << err;
  EXPECT_NE(err.find("neuronrun:   rank helper failing on purpose"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("job failed: rank 0"), std::string::npos) << err;
  EXPECT_EQ(err.find("job failed: rank 2"), std::string::npos) << err;
}

TEST(Neuronrun, RanksThatHonourSigtermStopPromptly) {
  LauncherProcess job({"-n", "4", kHelper, "fail", "1", "5"});
  EXPECT_EQ(job.Wait(30s), 5);
  EXPECT_LT(job.ElapsedSeconds(), 2.0);
}

TEST(Neuronrun, RankKilledFromOutsideIsNamed) {
  LauncherProcess job({"-n", "3", kHelper, "selfkill", "1"});
  EXPECT_EQ(job.Wait(30s), 128 + SIGKILL);
  EXPECT_NE(job.Stderr().find("rank 1 (node 0"), std::string::npos) << job.Stderr();
  EXPECT_NE(job.Stderr().find("was killed by SIGKILL (signal 9) from outside, possibly "
                              "out of memory"),
            std::string::npos)
      << job.Stderr();
}

TEST(Neuronrun, SigtermToNeuronrunLeavesNoProcess) {
  const std::string id = UniqueRunId("term");
  LauncherProcess job({"-n", "4", "--run-id", id, kHelper, "sleep", "60"});
  ASSERT_TRUE(job.WaitForOutput("sleeping", 4, 20s)) << job.Stderr();
  EXPECT_EQ(ProcessesOfJob(id).size(), 8u) << "4 ranks and their 4 children";
  job.Signal(SIGTERM);
  EXPECT_EQ(job.Wait(20s), 128 + SIGTERM);
  EXPECT_NE(job.Stderr().find("interrupted by SIGTERM"), std::string::npos) << job.Stderr();
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(Neuronrun, SigkillToNeuronrunLeavesNoProcess) {
  const std::string id = UniqueRunId("kill");
  LauncherProcess job({"-n", "3", "--run-id", id, kHelper, "sleep", "60"});
  ASSERT_TRUE(job.WaitForOutput("sleeping", 3, 20s)) << job.Stderr();
  EXPECT_EQ(ProcessesOfJob(id).size(), 6u);
  job.Signal(SIGKILL);
  EXPECT_EQ(job.Wait(20s), 128 + SIGKILL);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 5s).empty());
}

// A process that leaves its rank's process group (setsid) is missed by the
// kill of the group; neuronrun (a child subreaper, so still its ancestor)
// kills it when the job ends, and says so.
TEST(Neuronrun, AProcessThatLeftItsRanksGroupEndsWithTheJob) {
  const std::string id = UniqueRunId("setsid");
  LauncherProcess job(
      {"-n", "1", "--run-id", id, "/bin/sh", "-c",
       "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 1; echo started"});
  EXPECT_EQ(job.Wait(30s), 0) << job.Stderr();
  const auto left = WaitNoProcessesOfJob(id, 5s);
  for (pid_t pid : left) ::kill(pid, SIGKILL);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the job outlived neuronrun";
  EXPECT_NE(job.Stderr().find("left running by the ranks outside their process groups"),
            std::string::npos)
      << job.Stderr();
}

// neuronrun SIGKILLed: a process that left its rank's group is no longer
// its descendant, but it carries the rank's NEURON_AGENT_ID, by which the
// watchdog finds and kills it.
TEST(Neuronrun, AProcessThatLeftItsRanksGroupEndsWhenNeuronrunIsKilled) {
  const std::string id = UniqueRunId("setsidkill");
  LauncherProcess job({"-n", "1", "--run-id", id, "/bin/sh", "-c",
                       "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo started; "
                       "sleep 300"});
  ASSERT_TRUE(job.WaitForOutput("started", 1, 20s)) << job.Stderr();
  for (int i = 0; i < 200 && ProcessesOfJob(id).size() < 3; ++i) {
    std::this_thread::sleep_for(25ms);
  }
  ASSERT_GE(ProcessesOfJob(id).size(), 3u) << "the rank, its sleep and the setsid'd one";
  job.Signal(SIGKILL);
  EXPECT_EQ(job.Wait(20s), 128 + SIGKILL);
  const auto left = WaitNoProcessesOfJob(id, 5s);
  for (pid_t pid : left) ::kill(pid, SIGKILL);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the job outlived neuronrun";
}

TEST(Neuronrun, SecondSigintKillsAtOnce) {
  const std::string id = UniqueRunId("int");
  LauncherProcess job({"-n", "2", "--grace-period", "30", "--run-id", id, kHelper,
                       "stubborn", "99", "0"});
  for (int i = 0; i < 200 && ProcessesOfJob(id).size() < 2; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(ProcessesOfJob(id).size(), 2u);
  std::this_thread::sleep_for(300ms);  // let them install their SIG_IGN
  job.Signal(SIGINT);  // forwarded, and ignored by the ranks
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(ProcessesOfJob(id).size(), 2u);
  job.Signal(SIGINT);  // the second one kills without waiting the 30 s grace
  EXPECT_EQ(job.Wait(10s), 128 + SIGINT);
  EXPECT_LT(job.ElapsedSeconds(), 5.0);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(Neuronrun, RestartsCountUp) {
  LauncherProcess job({"-n", "2", "--max-restarts", "3", kHelper, "restart", "2"});
  EXPECT_EQ(job.Wait(), 0) << job.Stderr();
  for (int r = 0; r < 2; ++r) {
    for (int count = 0; count <= 2; ++count) {
      EXPECT_NE(job.Stdout().find("[rank " + std::to_string(r) + "]: restart count " +
                                  std::to_string(count)),
                std::string::npos)
          << job.Stdout();
    }
  }
  EXPECT_NE(job.Stderr().find("restarting the job (restart 2 of 3)"), std::string::npos);

  LauncherProcess out_of_restarts(
      {"-n", "2", "--max-restarts", "1", kHelper, "restart", "5"});
  EXPECT_EQ(out_of_restarts.Wait(), 7);
  EXPECT_NE(out_of_restarts.Stderr().find("the job failed after 2 attempts"),
            std::string::npos)
      << out_of_restarts.Stderr();
}

// A job that fails at once is restarted after 0.5 s, then 1 s: the back-off
// grows, so it does not spin.
TEST(Neuronrun, RestartsBackOffExponentially) {
  LauncherProcess job({"-n", "1", "--max-restarts", "2", "/bin/sh", "-c",
                       "date +%s.%N; exit 3"});
  EXPECT_EQ(job.Wait(), 3) << job.Stderr();
  std::vector<double> starts;
  for (const std::string& line : Lines(job.Stdout())) {
    const std::string prefix = "[rank 0]: ";
    if (line.rfind(prefix, 0) == 0) starts.push_back(std::stod(line.substr(prefix.size())));
  }
  ASSERT_EQ(starts.size(), 3u) << job.Stdout();
  const double first = starts[1] - starts[0];
  const double second = starts[2] - starts[1];
  EXPECT_GE(first, 0.5);
  EXPECT_GE(second, 1.0);
  EXPECT_GT(second, first + 0.25);
  EXPECT_NE(job.Stderr().find("restarting the job (restart 1 of 2) in 0.5 s"), std::string::npos)
      << job.Stderr();
  EXPECT_NE(job.Stderr().find("restarting the job (restart 2 of 2) in 1 s"), std::string::npos)
      << job.Stderr();
}

// A link planted where a rank's log file will be is an error naming it; the
// file it points to is untouched and no rank runs.
TEST(Neuronrun, LogDirNeverFollowsAPlantedLink) {
  char tmpl[] = "/tmp/neuronrun_logs_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious\n";
  ::mkdir((dir + "/attempt_0").c_str(), 0700);
  const std::string planted = dir + "/attempt_0/rank_0.stdout";
  ASSERT_EQ(::symlink(victim.c_str(), planted.c_str()), 0);
  LauncherProcess job({"-n", "2", "--log-dir", dir, kHelper, "env"});
  EXPECT_EQ(job.Wait(), 1);
  EXPECT_NE(job.Stderr().find("cannot write log file " + planted +
                              ": it is a symbolic link, not followed"),
            std::string::npos)
      << job.Stderr();
  std::ifstream in(victim);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "precious\n");
  std::filesystem::remove_all(dir);
}

TEST(Neuronrun, LogDirKeepsPerRankFilesAndTeeCopiesToConsole) {
  char tmpl[] = "/tmp/neuronrun_logs_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  LauncherProcess job({"-n", "2", "--log-dir", dir, "--tee", kHelper, "fail", "1", "4"});
  EXPECT_EQ(job.Wait(), 4);
  std::ifstream err(dir + "/attempt_0/rank_1.stderr");
  std::stringstream text;
  text << err.rdbuf();
  EXPECT_EQ(text.str(), "rank helper failing on purpose\n");
  EXPECT_TRUE(std::ifstream(dir + "/attempt_0/rank_0.stdout").good());
  EXPECT_NE(job.Stderr().find("[rank 1]: rank helper failing on purpose"),
            std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

// --- multi-node on loopback ------------------------------------------------

std::vector<std::string> NodeArgs(int node, int port, const std::string& extra_id,
                                  std::vector<std::string> program) {
  std::vector<std::string> args = {"--nnodes", "2", "--node-rank", std::to_string(node),
                                   "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                                   "--rdzv-timeout", "30", "-n", "3"};
  if (!extra_id.empty()) args.insert(args.end(), {"--run-id", extra_id});
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

const std::map<std::string, std::string> kSharedSecret = {
    {"NEURON_RDZV_SECRET", "two-node-test-secret"}};

TEST(NeuronrunMultiNode, TwoAgentsAgreeOnOneWorld) {
  const int port = FreePort();
  LauncherProcess node1(NodeArgs(1, port, "", {kHelper, "env"}), kSharedSecret);
  LauncherProcess node0(NodeArgs(0, port, "", {kHelper, "env"}), kSharedSecret);
  ASSERT_EQ(node0.Wait(), 0) << node0.Stderr();
  ASSERT_EQ(node1.Wait(), 0) << node1.Stderr();
  auto ranks = ParseEnvOutput(node0.Stdout());
  const auto ranks1 = ParseEnvOutput(node1.Stdout());
  ASSERT_EQ(ranks.size(), 3u);
  ASSERT_EQ(ranks1.size(), 3u);
  ranks.insert(ranks1.begin(), ranks1.end());
  ASSERT_EQ(ranks.size(), 6u) << "global ranks must not overlap";
  for (int r = 0; r < 6; ++r) {
    const auto& env = ranks.at(r);
    EXPECT_EQ(env.at("RANK"), std::to_string(r));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(r % 3));
    EXPECT_EQ(env.at("GROUP_RANK"), std::to_string(r / 3));
    EXPECT_EQ(env.at("WORLD_SIZE"), "6");
    EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "3");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT"), ranks.at(0).at("MASTER_PORT"));
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), ranks.at(0).at("TORCHELASTIC_RUN_ID"));
    EXPECT_EQ(env.at("NEURON_CHIP_INDEX"), std::to_string((r / 3) * 16 + r % 3));
    EXPECT_EQ(env.at("NEURON_STORE_ENDPOINT"), "127.0.0.1:" + std::to_string(port));
  }
}

// An agent started with another --nnodes than node 0's: both end, and the
// agent learns node 0's reason (not that the store went away).
TEST(NeuronrunMultiNode, MismatchedNnodesIsRefusedWithNodeZerosReason) {
  const int port = FreePort();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  LauncherProcess node1({"--nnodes", "3", "--node-rank", "1", "--rdzv-endpoint", endpoint,
                         "--rdzv-timeout", "30", "-n", "1", kHelper, "env"},
                        kSharedSecret);
  LauncherProcess node0({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                         "--rdzv-timeout", "30", "-n", "1", kHelper, "env"},
                        kSharedSecret);
  EXPECT_NE(node0.Wait(30s), 0);
  EXPECT_NE(node1.Wait(30s), 0);
  EXPECT_NE(node0.Stderr().find("was started with --nnodes 3 but node 0 with --nnodes 2"),
            std::string::npos)
      << node0.Stderr();
  EXPECT_NE(node1.Stderr().find("refused by node 0: node 1 ("), std::string::npos)
      << node1.Stderr();
  EXPECT_NE(node1.Stderr().find("was started with --nnodes 3 but node 0 with --nnodes 2"),
            std::string::npos)
      << node1.Stderr();
}

// The other way round node 1 finds the mismatch, and node 0 names it.
TEST(NeuronrunMultiNode, MismatchedNnodesNamesTheNodeThatFoundIt) {
  const int port = FreePort();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  LauncherProcess node0({"--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                         "--rdzv-timeout", "30", "-n", "1", kHelper, "env"},
                        kSharedSecret);
  LauncherProcess node1({"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint,
                         "--rdzv-timeout", "30", "-n", "1", kHelper, "env"},
                        kSharedSecret);
  EXPECT_NE(node0.Wait(30s), 0);
  EXPECT_NE(node1.Wait(30s), 0);
  EXPECT_NE(node0.Stderr().find("refused by node 1: node 0 ("), std::string::npos)
      << node0.Stderr();
  EXPECT_NE(node0.Stderr().find("was started with --nnodes 3 but node 1 with --nnodes 2"),
            std::string::npos)
      << node0.Stderr();
}

TEST(NeuronrunMultiNode, FailureOnOneNodeEndsBoth) {
  const int port = FreePort();
  const std::string id = UniqueRunId("mnfail");
  LauncherProcess node1(NodeArgs(1, port, id, {kHelper, "fail", "4", "6"}), kSharedSecret);
  LauncherProcess node0(NodeArgs(0, port, id, {kHelper, "fail", "4", "6"}), kSharedSecret);
  EXPECT_EQ(node0.Wait(30s), 6);
  EXPECT_EQ(node1.Wait(30s), 6);
  EXPECT_NE(node0.Stderr().find("job failed: rank 4 (node 1"), std::string::npos)
      << node0.Stderr();
  EXPECT_NE(node0.Stderr().find("rank helper failing on purpose"), std::string::npos);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(NeuronrunMultiNode, LostAgentEndsTheJobOnTheOtherNode) {
  const int port = FreePort();
  const std::string id = UniqueRunId("mnlost");
  LauncherProcess node0(NodeArgs(0, port, id, {kHelper, "sleep", "60"}), kSharedSecret);
  LauncherProcess node1(NodeArgs(1, port, id, {kHelper, "sleep", "60"}), kSharedSecret);
  ASSERT_TRUE(node1.WaitForOutput("sleeping", 3, 20s));
  node1.Signal(SIGKILL);
  // Node 0 does not wait out the grace period and 10 s (15 s) for the lost
  // agent to leave: its closed connection counts as left.
  EXPECT_EQ(node0.Wait(8s), 1);
  EXPECT_NE(node0.Stderr().find("the neuronrun agent of node 1"), std::string::npos)
      << node0.Stderr();
  node1.Wait(5s);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 5s).empty());
}

TEST(NeuronrunMultiNode, LostNodeZeroEndsTheJobWithOneReport) {
  const int port = FreePort();
  const std::string id = UniqueRunId("mnlost0");
  LauncherProcess node0(NodeArgs(0, port, id, {kHelper, "sleep", "60"}), kSharedSecret);
  LauncherProcess node1(NodeArgs(1, port, id, {kHelper, "sleep", "60"}), kSharedSecret);
  ASSERT_TRUE(node1.WaitForOutput("sleeping", 3, 20s));
  node0.Signal(SIGKILL);
  EXPECT_EQ(node1.Wait(20s), 1);
  const std::string err = node1.Stderr();
  EXPECT_NE(err.find("lost contact with the job's store on node 0"), std::string::npos)
      << err;
  // Leaving a store that is gone is not a second error.
  EXPECT_EQ(err.find("neuronrun: error:"), std::string::npos) << err;
  node0.Wait(5s);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 5s).empty());
}

TEST(NeuronrunMultiNode, AgentWithTheWrongSecretIsRefused) {
  const int port = FreePort();
  LauncherProcess node0(NodeArgs(0, port, "", {kHelper, "env"}), kSharedSecret);
  LauncherProcess intruder(NodeArgs(1, port, "", {kHelper, "env"}),
                           {{"NEURON_RDZV_SECRET", "a-guessed-secret-long-enough"}});
  EXPECT_EQ(intruder.Wait(30s), 2);
  EXPECT_NE(intruder.Stderr().find("refused this client"), std::string::npos)
      << intruder.Stderr();
  EXPECT_TRUE(intruder.Stdout().empty());
  node0.Signal(SIGTERM);
  node0.Wait(20s);
  EXPECT_NE(node0.Stderr().find("refused client 127.0.0.1"), std::string::npos)
      << node0.Stderr();
}

// --- bad input ----------------------------------------------------------------

struct BadInput {
  std::vector<std::string> args;
  std::string message;
};

void PrintTo(const BadInput& input, std::ostream* os) { *os << input.message; }

class NeuronrunBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(NeuronrunBadInput, OneLineErrorExitTwoNoProcesses) {
  const std::string id = UniqueRunId("bad");
  std::vector<std::string> args = {"--run-id", id};
  args.insert(args.end(), GetParam().args.begin(), GetParam().args.end());
  LauncherProcess job(args);
  EXPECT_EQ(job.Wait(30s), 2);
  const auto lines = Lines(job.Stderr());
  ASSERT_EQ(lines.size(), 1u) << job.Stderr();
  EXPECT_EQ(lines[0].rfind("neuronrun: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(GetParam().message), std::string::npos) << lines[0];
  EXPECT_TRUE(job.Stdout().empty());
  EXPECT_TRUE(ProcessesOfJob(id).empty());
}

std::string BadInputName(const ::testing::TestParamInfo<BadInput>& info) {
  static const char* kNames[] = {"UnknownFlag",   "ZeroRanks",       "MissingScript",
                                 "MissingProgram", "TooManyRanks",   "MissingTopology",
                                 "MissingDevice", "SilentEndpoint",  "MissingPython"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    All, NeuronrunBadInput,
    ::testing::Values(
        BadInput{{"--nproc", "2", "x.py"}, "unknown option '--nproc'"},
        BadInput{{"-n", "0", "/bin/true"}, "-n must be between 1 and 1024, got 0"},
        BadInput{{"-n", "2", "no_such_script.py"}, "script 'no_such_script.py' does not exist"},
        BadInput{{"-n", "2", "no-such-program-anywhere"}, "not found on PATH"},
        BadInput{{"-n", "17", "/bin/true"}, "node 0 has 17 ranks"},
        BadInput{{"--topology", "/nonexistent.textproto", "/bin/true"},
                 "cannot read topology file /nonexistent.textproto"},
        BadInput{{"--device", "/nonexistent.textproto", "/bin/true"},
                 "cannot read device spec file /nonexistent.textproto"},
        BadInput{{"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                  "127.0.0.1:1", "--rdzv-timeout", "1", "/bin/true"},
                 "rendezvous endpoint 127.0.0.1:1 did not answer within 1 s"},
        BadInput{{"--python", "/no/python", NEURON_SOURCE_DIR "/examples/01_allreduce_barrier.py"},
                 "python interpreter '/no/python' not found"}),
    BadInputName);

TEST(NeuronrunBadInput, ProgramThatCannotExecuteFailsTheJob) {
  char tmpl[] = "/tmp/neuronrun_notexec_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  const std::string garbage = "\x7f" "ELF but not really";
  ASSERT_EQ(::write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  ::fchmod(fd, 0755);
  ::close(fd);
  const std::string id = UniqueRunId("noexec");
  LauncherProcess job({"-n", "3", "--run-id", id, tmpl});
  EXPECT_EQ(job.Wait(30s), 1);
  EXPECT_NE(job.Stderr().find(std::string("cannot execute ") + tmpl + ": Exec format error"),
            std::string::npos)
      << job.Stderr();
  EXPECT_TRUE(ProcessesOfJob(id).empty());
  ::unlink(tmpl);
}

// A secret too short or blank to be shared rather than guessed is refused
// before any rendezvous, naming where it came from.
TEST(NeuronrunBadInput, ShortOrBlankSecretIsRefusedNamingItsSource) {
  const std::vector<std::string> args = {"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
                                         "-n", "1", "/bin/true"};
  const std::vector<std::pair<std::string, std::string>> env_cases = {
      {"x", "the secret from $NEURON_RDZV_SECRET has 1 bytes; at least 16 are needed"},
      {"guessed", "the secret from $NEURON_RDZV_SECRET has 7 bytes"},
      {std::string(24, ' '), "the secret from $NEURON_RDZV_SECRET is only whitespace"}};
  for (const auto& [secret, message] : env_cases) {
    LauncherProcess job(args, {{"NEURON_RDZV_SECRET", secret}});
    EXPECT_EQ(job.Wait(30s), 2);
    EXPECT_NE(job.Stderr().find("neuronrun: error: " + message), std::string::npos)
        << job.Stderr();
  }
  char tmpl[] = "/tmp/neuronrun_nulsecret_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  const std::string nuls(32, '\0');
  ASSERT_EQ(::write(fd, nuls.data(), nuls.size()), static_cast<ssize_t>(nuls.size()));
  ::close(fd);
  std::vector<std::string> file_args = {"--rdzv-secret-file", tmpl};
  file_args.insert(file_args.end(), args.begin(), args.end());
  LauncherProcess job(file_args);
  EXPECT_EQ(job.Wait(30s), 2);
  EXPECT_NE(job.Stderr().find(std::string("the secret from rendezvous secret file ") + tmpl +
                              " is only whitespace or NUL bytes"),
            std::string::npos)
      << job.Stderr();
  ::unlink(tmpl);
}

// Refused before any rank starts: a usage error naming the flag.
TEST(NeuronrunBadInput, LogDirThatCannotBeCreatedIsAUsageError) {
  const std::string id = UniqueRunId("nolog");
  LauncherProcess job({"-n", "3", "--log-dir", "/proc/neuronrun-cannot-be-here", "--run-id", id,
                       kHelper, "sleep", "60"});
  EXPECT_EQ(job.Wait(30s), 2);
  EXPECT_NE(job.Stderr().find("neuronrun: error: --log-dir /proc/neuronrun-cannot-be-here: "
                              "cannot create it"),
            std::string::npos)
      << job.Stderr();
  EXPECT_LT(job.ElapsedSeconds(), 10.0);
  EXPECT_TRUE(WaitNoProcessesOfJob(id, 2s).empty());
}

TEST(NeuronrunBadInput, PortsAlreadyInUse) {
  // Hold a port, then ask neuronrun for it as MASTER_PORT and as the
  // rendezvous port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  LauncherProcess master({"--master-port", port, "-n", "2", "/bin/true"});
  EXPECT_EQ(master.Wait(), 2);
  EXPECT_NE(master.Stderr().find("--master-port " + port + " is already in use"),
            std::string::npos)
      << master.Stderr();

  LauncherProcess rdzv({"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:" + port, "-n", "1",
                        "/bin/true"},
                       kSharedSecret);
  EXPECT_EQ(rdzv.Wait(), 2);
  EXPECT_NE(rdzv.Stderr().find("port " + port + " is already in use"), std::string::npos)
      << rdzv.Stderr();
  ::close(fd);
}

// A real matrix cell of more ranks than this host runs at once is refused
// before any agent is forked, naming the cap and how to raise it: at a cap
// set by hand, and at the host's own for 4096 one-rank nodes.
TEST(NeuronrunMatrix, RealCellsBeyondTheHostAreRefusedBeforeAnyFork) {
  char tmpl[] = "/tmp/neuronrun_matrix_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string file = dir + "/m.textproto";
  const std::string tail =
      "strategies { name: \"a\" }\nmodels { name: \"m\" dim: 16 layers: 1 heads: 2 }\n";
  std::ofstream(file) << "name: \"x\"\nranks_per_node: [4]\n" << tail;
  LauncherProcess capped({"matrix", file, "--out", dir + "/out", "--max-host-ranks", "2"});
  EXPECT_EQ(capped.Wait(), 2);
  EXPECT_NE(capped.Stderr().find(file + ": cell n1x4-a-m-eager-default runs 4 real ranks (1 "
                                 "nodes x 4 ranks per node, within max_real_ranks 16), more "
                                 "than the 2 this host runs at once (--max-host-ranks 2); "
                                 "lower max_real_ranks so that it is modelled, or raise the "
                                 "cap with neuronrun matrix --max-host-ranks N"),
            std::string::npos)
      << capped.Stderr();
  std::ofstream(file) << "name: \"x\"\nnodes: [4096]\nranks_per_node: [1]\n"
                         "max_real_ranks: 65536\n" << tail;
  LauncherProcess wide({"matrix", file, "--out", dir + "/out"});
  EXPECT_EQ(wide.Wait(), 2);
  EXPECT_TRUE(std::regex_search(wide.Stderr(),
                                std::regex("runs 4096 real ranks .* more than the [0-9]+ this "
                                           "host runs at once \\([0-9]+ MiB of memory at 256 "
                                           "MiB a rank\\)")))
      << wide.Stderr();
  EXPECT_LT(wide.ElapsedSeconds(), 10.0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/out"));
  std::filesystem::remove_all(dir);
}

TEST(Neuronrun, HelpDocumentsEveryOption) {
  LauncherProcess job({"--help"});
  EXPECT_EQ(job.Wait(), 0);
  for (const char* flag : {"--nproc-per-node", "--nnodes",
                           "--node-rank",      "--rdzv-endpoint",
                           "--rdzv-timeout",   "--rdzv-secret-file",
                           "--master-port",    "--max-restarts",
                           "--log-dir",        "--tee",
                           "--topology",       "--device",
                           "--run-id",         "--rdzv-id",
                           "--rdzv-backend",   "--standalone",
                           "--bind-to",        "--module",
                           "--no-python",      "--python",
                           "--grace-period"}) {
    EXPECT_NE(job.Stdout().find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace neuron::launcher::testing
