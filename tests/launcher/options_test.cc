#include "neuron/launcher/options.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "neuron/runtime/error.h"

namespace neuron::launcher {
namespace {

LaunchOptions Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "neuronrun");
  return ParseOptions(static_cast<int>(args.size()), args.data());
}

std::string ErrorOf(std::vector<const char*> args) {
  try {
    ValidateOptions(Parse(std::move(args)));
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "";
}

TEST(Options, ParsesEveryOption) {
  const auto o = Parse({"-n", "16", "--nnodes=2", "--node-rank", "1", "--rdzv-endpoint",
                        "host:29400", "--rdzv-timeout", "30", "--master-port", "4000",
                        "--max-restarts", "3", "--log-dir", "/tmp/x", "--tee",
                        "--topology", "t.textproto", "--run-id", "job7", "--python",
                        "/opt/venv/bin/python", "--grace-period", "0.5", "train.py",
                        "--lr", "0.1", "-n", "3"});
  EXPECT_EQ(o.nproc_per_node, 16u);
  EXPECT_EQ(o.nnodes, 2u);
  EXPECT_EQ(o.node_rank, 1u);
  EXPECT_EQ(o.rdzv_host, "host");
  EXPECT_EQ(o.rdzv_port, 29400);
  EXPECT_EQ(o.rdzv_timeout.count(), 30);
  EXPECT_EQ(*o.master_port, 4000);
  EXPECT_EQ(o.max_restarts, 3u);
  EXPECT_EQ(o.log_dir, "/tmp/x");
  EXPECT_TRUE(o.tee);
  EXPECT_EQ(o.topology_file, "t.textproto");
  EXPECT_EQ(o.run_id, "job7");
  EXPECT_EQ(o.grace_period.count(), 500);
  EXPECT_EQ(o.program, "train.py");
  // Everything after the program belongs to it, flags included.
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--lr", "0.1", "-n", "3"}));
}

TEST(Options, TakesTorchrunCommandLines) {
  const auto o = Parse({"--standalone", "--nproc_per_node=4", "--node_rank", "0",
                        "--rdzv_backend", "c10d", "--rdzv_id", "job9", "--max_restarts=1",
                        "-m", "pkg.train", "--epochs", "2"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.nproc_per_node, 4u);
  EXPECT_EQ(o.run_id, "job9");
  EXPECT_EQ(o.max_restarts, 1u);
  EXPECT_TRUE(o.module);
  EXPECT_TRUE(RunsUnderPython(o));
  EXPECT_EQ(o.program, "pkg.train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--epochs", "2"}));
  const auto direct = Parse({"--no_python", "tool.py"});
  EXPECT_TRUE(direct.no_python);
  EXPECT_FALSE(RunsUnderPython(direct));
  EXPECT_TRUE(RunsUnderPython(Parse({"train.py"})));
}

TEST(Options, RefusesTorchrunOptionsItCannotHonour) {
  EXPECT_NE(ErrorOf({"--rdzv_backend", "etcd", "/bin/true"}).find(
                "--rdzv-backend 'etcd': neuronrun's rendezvous is node 0's authenticated store"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--standalone", "--nnodes", "2", "--rdzv-endpoint", "h:1", "/bin/true"})
                .find("--standalone is a single-node job; got --nnodes 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-m", "--no-python", "x"}).find("cannot be combined with --no-python"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-m", "a/b.py"}).find("-m expects a module name"), std::string::npos);
}

TEST(Options, DefaultsMatchTheHelp) {
  const auto o = Parse({"/bin/true"});
  EXPECT_EQ(o.nproc_per_node, 1u);
  EXPECT_EQ(o.nnodes, 1u);
  EXPECT_FALSE(o.master_port.has_value());  // a free port, never a fixed 29500
  EXPECT_EQ(o.grace_period.count(), 5000);
  EXPECT_NE(HelpText().find("--max-restarts"), std::string::npos);
}

TEST(Options, DoubleDashEndsOptions) {
  const auto o = Parse({"-n", "2", "--", "--weird-program-name"});
  EXPECT_EQ(o.program, "--weird-program-name");
}

TEST(Options, BadInputNamesTheProblem) {
  EXPECT_NE(ErrorOf({"--frobnicate", "x.py"}).find("unknown option '--frobnicate'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-n", "0", "/bin/true"}).find("-n must be between 1 and 1024, got 0"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-n", "two", "/bin/true"}).find("expects a whole number"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-n"}).find("needs a value"), std::string::npos);
  EXPECT_NE(ErrorOf({"-n", "2"}).find("no program given"), std::string::npos);
  EXPECT_NE(ErrorOf({"missing_script.py"}).find("script 'missing_script.py' does not exist"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"/no/such/binary"}).find("does not exist or is not executable"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--nnodes", "2", "/bin/true"}).find("needs --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--nnodes", "2", "--node-rank", "2", "/bin/true"})
                .find("--node-rank 2 must be less than --nnodes 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--rdzv-endpoint", "nohostport", "/bin/true"}).find("HOST:PORT"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--tee", "/bin/true"}).find("--tee needs --log-dir"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--master-port", "70000", "/bin/true"}).find("between 1 and 65535"),
            std::string::npos);
  // A script whose interpreter is missing is not reported as missing itself.
  const std::string script = ::testing::TempDir() + "/no_interpreter.sh";
  {
    std::ofstream(script) << "#!/nonexistent/interp -x\necho hi\n";
    ::chmod(script.c_str(), 0755);
  }
  EXPECT_NE(ErrorOf({"--no-python", script.c_str()})
                .find("its #! interpreter '/nonexistent/interp' does not exist or is not "
                      "executable"),
            std::string::npos)
      << ErrorOf({"--no-python", script.c_str()});
  // A whole number is digits only.
  EXPECT_NE(ErrorOf({"-n", " 2", "/bin/true"}).find("-n expects a whole number, got ' 2'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-n", "+2", "/bin/true"}).find("-n expects a whole number, got '+2'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-n", "0x2", "/bin/true"}).find("expects a whole number"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"--max-restarts", "99999999999999999999999", "/bin/true"})
                .find("expects a whole number"),
            std::string::npos);
}

}  // namespace
}  // namespace neuron::launcher
