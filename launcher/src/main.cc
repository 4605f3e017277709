// neuronrun: the launcher. Parses the command line, resolves everything that
// can be checked before a rank starts (exit status 2 on any problem), then
// hands the job to the Agent.
#include <google/protobuf/text_format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <filesystem>
#include <iostream>

#include "agent.h"
#include "child_process.h"
#include "flag_values.h"
#include "matrix_host.h"
#include "matrix_replay.h"
#include "predict.h"
#include "zygote_main.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/launcher/matrix.h"
#include "neuron/launcher/options.h"
#include "neuron/parallel/pipeline_trace_scaling.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_calibration.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/fabric/trace_scaling.h"
#include "secret.h"
#include "zygote.h"

namespace neuron::launcher {
namespace {

constexpr int kUsageError = 2;

std::string Hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// The address node 0's store server binds: loopback for a single node, else
// the interface that --rdzv-endpoint's host name resolves to.
std::string BindAddress(const LaunchOptions& o) {
  if (o.nnodes == 1) return "127.0.0.1";
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(o.rdzv_host, std::to_string(o.rdzv_port), ec);
  NEURON_CHECK(!ec && !results.empty(), "cannot resolve --rdzv-endpoint host '",
               o.rdzv_host, "': ", ec.message());
  return results.begin()->endpoint().address().to_string();
}

JobConfig Resolve(LaunchOptions o) {
  ValidateOptions(o);
  JobConfig c(o, o.topology_file.empty() ? runtime::Topology::Default()
                                         : runtime::Topology::FromFile(o.topology_file));
  if (!o.log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(o.log_dir, error);
    NEURON_CHECK(!error, "--log-dir ", o.log_dir, ": cannot create it: ", error.message());
  }
  c.topology.CheckFits(o.nnodes, {o.nproc_per_node});
  // The ranks add NEURON_FAULTS to the topology: faults must not cut them apart.
  runtime::CheckRoutes(runtime::Topology::WithEnvironmentFaults(c.topology), o.nnodes,
                       std::vector<std::uint32_t>(o.nnodes, o.nproc_per_node));
  if (!o.topology_file.empty()) {
    c.topology_file = std::filesystem::absolute(o.topology_file).string();
  }
  // The ranks' fabric models would reject a bad calibration or device file:
  // say so once, before any starts.
  runtime::CheckCollectiveCalibration(c.topology);
  if (!o.device_file.empty()) {
    runtime::DeviceSpec::FromFile(o.device_file);
    c.device_file = std::filesystem::absolute(o.device_file).string();
  }
  c.run_id = o.run_id.empty() ? collectives::auth::GenerateSecret().substr(0, 12) : o.run_id;
  c.secret = o.nnodes == 1 ? collectives::auth::GenerateSecret()
                           : LoadOrCreateRdzvSecret(o.rdzv_secret_file);
  c.hostname = Hostname();
  c.bind_address = BindAddress(o);
  if (RunsUnderPython(o)) {
    const std::string python =
        o.python.empty()
            ? runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPython)
            : o.python;
    c.program_path = ResolveProgram(python);
    NEURON_CHECK(!c.program_path.empty(), "python interpreter '", python,
                 "' not found (set --python or NEURON_PYTHON)");
    c.program_argv = o.module ? std::vector<std::string>{python, "-m", o.program}
                              : std::vector<std::string>{python, o.program};
  } else {
    c.program_path = ResolveProgram(o.program);
    NEURON_CHECK(!c.program_path.empty(), "program '", o.program,
                 "' not found on PATH");
    c.program_argv = {o.program};
  }
  for (const auto& arg : o.program_args) c.program_argv.push_back(arg);
  c.python_path = NEURON_PYTHON_PACKAGE_DIR;
  const std::string preload =
      o.preload ? *o.preload : runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPreload);
  if (RunsUnderPython(o) && !preload.empty()) {
    c.preload = ParsePreload(preload, o.preload ? "--preload" : "NEURON_PRELOAD");
  }
  const auto& config = runtime::ConfigRegistry::Get();
  if (!c.preload.empty() && !config.GetString(runtime::ConfigKey::kZygoteFd).empty()) {
    c.zygote_fd = static_cast<int>(config.GetInt(runtime::ConfigKey::kZygoteFd));
  }
  if (!c.preload.empty()) c.zygote_socket = config.GetString(runtime::ConfigKey::kZygote);
  return c;
}

constexpr const char* kMatrixHelp =
    "usage: neuronrun matrix FILE [--out DIR] [--max-host-ranks N]\n"
    "Runs the scaling test matrix FILE (configs/scaling/*.textproto): every cell a real\n"
    "neuronrun job of the trainer; DIR (default: matrix-NAME) gets cells/ID/ (output.log,\n"
    "metrics.textproto, result.textproto), results.csv, report.md and the plots\n"
    "efficiency.png, breakdown.png and memory.png. A rerun skips completed cells;\n"
    "a failing cell is reported and the matrix goes on. The file is checked before any\n"
    "job starts, a real cell of more ranks than this host runs at once included\n"
    "(its memory at 256 MiB a rank; --max-host-ranks N sets the cap). The cells' Python\n"
    "ranks fork from one interpreter, for the whole matrix, that imported what the\n"
    "trainers use (" NEURON_TRAINER_MODULES ";\n"
    "NEURON_PRELOAD, set even empty, overrides; a cell of its own topology forks from\n"
    "its own, neuronrun --preload). Exit status:\n"
    "0 every cell completed, 1 some failed, 2 a bad file.\n";

// neuronrun matrix FILE [--out DIR] [--max-host-ranks N]
int MatrixMain(int argc, char** argv) {
  std::string file, out;
  HostCapacity host = DetectHostCapacity();
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kMatrixHelp;
      return 0;
    }
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--max-host-ranks" && i + 1 < argc) {
      try {
        host.max_ranks = static_cast<std::int64_t>(ParseUnsigned(a, argv[++i], 1, 65536));
      } catch (const std::exception& e) {
        std::cerr << "neuronrun matrix: error: " << e.what() << std::endl;
        return kUsageError;
      }
      host.reason = StrCat("--max-host-ranks ", host.max_ranks);
    } else if (file.empty() && a.rfind("-", 0) != 0) {
      file = a;
    } else {
      std::cerr << "neuronrun matrix: error: unexpected argument '" << a << "'\n"
                << kMatrixHelp;
      return kUsageError;
    }
  }
  if (file.empty()) {
    std::cerr << "neuronrun matrix: error: no matrix file\n" << kMatrixHelp;
    return kUsageError;
  }
  MatrixSpec spec;
  try {
    spec = LoadMatrix(file);
    CheckHostCapacity(spec, host);  // before any agent is forked
  } catch (const std::exception& e) {
    std::cerr << "neuronrun matrix: error: " << e.what() << std::endl;
    return kUsageError;
  }
  if (out.empty()) out = "matrix-" + spec.matrix.name();
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  // The plots: torchneuron.matrix_plots under the Python with torch and matplotlib.
  const std::string python = ResolveProgram(
      runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPython));
  const std::vector<std::string> plotter = {
      "/usr/bin/env", "PYTHONPATH=" NEURON_PYTHON_PACKAGE_DIR, python, "-m",
      "torchneuron.matrix_plots"};
  try {
    return RunMatrix(spec, out, self, plotter, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "neuronrun matrix: error: " << e.what() << std::endl;
    return 1;
  }
}

constexpr const char* kReplayHelp =
    "usage: neuronrun replay TRACE_DIR [--nodes N] [--ranks-per-node R] [--topology "
    "FILE]\n"
    "                        [--tokens-per-rank-step T] [--tp N --tp-from TRACE_DIR2]\n"
    "                        [--pp P]\n"
    "Replays a job's operation traces (TRACE_DIR/rank_N.pb, recorded with\n"
    "torchneuron.fabric.start_trace/save_trace, e.g. examples/04_train_gpt.py "
    "--trace-out)\n"
    "through the device and fabric models on N nodes x R ranks (default: the recorded\n"
    "ranks on one node) of FILE (default: the embedded trn2 node). More ranks than were\n"
    "recorded add data-parallel replicas (weak scaling). With --tp and --tp-from, a "
    "second\n"
    "recording of the same job at another tensor-parallel size, the job is first scaled\n"
    "to tp=N (each compute charge and size fitted through the two recordings on "
    "Amdahl's\n"
    "law). With --pp, a pipeline recording is then scaled to P stages (at least its "
    "own):\n"
    "its layers partitioned again, each layer's recorded work run in the schedule's "
    "order\n"
    "on its new stage (docs/scaling.md). Prints the modelled figures as a text proto\n"
    "(neuron.launcher.proto.RunFigures). Exit status: 0, or 2 when the traces cannot be\n"
    "replayed there.\n";

// neuronrun replay TRACE_DIR [...]
int ReplayMain(int argc, char** argv) {
  std::string dir;
  ReplayLayout layout;
  layout.ranks_per_node = 0;
  double tokens = 0;
  int tp = 0, pp = 0;
  std::string tp_from;
  try {
    for (int i = 0; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has_value = i + 1 < argc;
      if (a == "-h" || a == "--help") {
        std::cout << kReplayHelp;
        return 0;
      } else if (a == "--nodes" && has_value) {
        layout.nodes = static_cast<int>(ParseUnsigned(a, argv[++i], 1, 65536));
      } else if (a == "--ranks-per-node" && has_value) {
        layout.ranks_per_node = static_cast<int>(ParseUnsigned(a, argv[++i], 1, 65536));
      } else if (a == "--topology" && has_value) {
        layout.topology = argv[++i];
      } else if (a == "--tokens-per-rank-step" && has_value) {
        tokens = ParseFinite(a, argv[++i], 0, 1e15);
      } else if (a == "--tp" && has_value) {
        tp = static_cast<int>(ParseUnsigned(a, argv[++i], 1, 65536));
      } else if (a == "--tp-from" && has_value) {
        tp_from = argv[++i];
      } else if (a == "--pp" && has_value) {
        pp = static_cast<int>(ParseUnsigned(a, argv[++i], 1, 65536));
      } else if (dir.empty() && a.rfind("-", 0) != 0) {
        dir = a;
      } else {
        throw InvalidUsage(StrCat("unexpected argument '", a, "'"));
      }
    }
    NEURON_CHECK(!dir.empty(), "no trace directory");
    NEURON_CHECK(layout.nodes >= 1 && layout.ranks_per_node >= 0,
                 "--nodes and --ranks-per-node must be positive");
    NEURON_CHECK((tp == 0) == tp_from.empty(), "--tp and --tp-from go together");
    auto traces = runtime::LoadJobTraces(dir);
    if (tp > 0) {
      traces = runtime::ScaleTensorParallel(traces, runtime::LoadJobTraces(tp_from), tp);
    }
    if (pp > 0) traces = parallel::ScalePipeline(traces, pp);
    if (layout.ranks_per_node == 0) {  // the recorded job, on one node
      layout.ranks_per_node = static_cast<int>(traces.size());
    }
    std::string text;
    google::protobuf::TextFormat::PrintToString(ReplayFigures(traces, layout, tokens), &text);
    std::cout << text;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "neuronrun replay: error: " << e.what() << "\n" << kReplayHelp;
    return kUsageError;
  }
}

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "matrix") return MatrixMain(argc - 2, argv + 2);
  if (argc >= 2 && std::string(argv[1]) == "replay") return ReplayMain(argc - 2, argv + 2);
  if (argc >= 2 && std::string(argv[1]) == "predict") return PredictMain(argc - 2, argv + 2);
  if (argc >= 2 && std::string(argv[1]) == "zygote") return ZygoteMain(argc - 2, argv + 2);
  LaunchOptions options;
  std::unique_ptr<Agent> agent;
  try {
    options = ParseOptions(argc, argv);
    if (options.help) {
      std::cout << HelpText();
      return 0;
    }
    if (options.fallback_report) {  // the ranks inherit it (docs/launcher.md)
      ::setenv(runtime::VariableName(runtime::ConfigKey::kFallbackReport), "1", 1);
    }
    agent = std::make_unique<Agent>(Resolve(options));
  } catch (const Error& e) {
    std::cerr << "neuronrun: error: " << e.what() << std::endl;
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "neuronrun: error: " << e.what() << std::endl;
    return kUsageError;
  }
  try {
    return agent->Run();
  } catch (const InvalidUsage& e) {
    std::cerr << "neuronrun: error: " << e.what() << std::endl;
    return kUsageError;
  } catch (const TimeoutError& e) {
    std::cerr << "neuronrun: error: " << e.what() << std::endl;
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "neuronrun: error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace
}  // namespace neuron::launcher

int main(int argc, char** argv) {
  // Orphaned grandchildren of the ranks come to neuronrun, not to init, so
  // they are reaped and accounted for; a closed console is no reason to die.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);
  return neuron::launcher::Main(argc, argv);
}
