#include "neuron/launcher/options.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>

#include "child_process.h"
#include "zygote.h"
#include "flag_values.h"
#include "neuron/runtime/error.h"

namespace neuron::launcher {

namespace {

double ParseSeconds(const std::string& flag, const std::string& text) {
  return ParseFinite(flag, text, 0, 86400);
}

void ParseEndpoint(const std::string& text, LaunchOptions& o) {
  const auto colon = text.rfind(':');
  NEURON_CHECK(colon != std::string::npos && colon > 0,
               "--rdzv-endpoint expects HOST:PORT, got '", text, "'");
  o.rdzv_host = text.substr(0, colon);
  o.rdzv_port = static_cast<std::uint16_t>(
      ParseUnsigned("--rdzv-endpoint port", text.substr(colon + 1), 1, 65535));
}

// A script's "#!" interpreter must exist: exec reports a missing one as the
// script itself missing (ENOENT).
void CheckInterpreter(const std::string& program) {
  const int fd = ::open(program.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;  // exec will say why
  char head[256] = {};
  const ssize_t n = ::read(fd, head, sizeof(head) - 1);
  ::close(fd);
  if (n < 2 || head[0] != '#' || head[1] != '!') return;
  std::string line(head + 2, static_cast<std::size_t>(n - 2));
  line = line.substr(0, line.find('\n'));
  const auto begin = line.find_first_not_of(" \t");
  if (begin == std::string::npos) return;
  const std::string interpreter = line.substr(begin, line.find_first_of(" \t\r", begin) - begin);
  NEURON_CHECK(::access(interpreter.c_str(), X_OK) == 0, "program '", program,
               "': its #! interpreter '", interpreter, "' does not exist or is not executable");
}

using Setter = std::function<void(const std::string& flag, const std::string& value,
                                  LaunchOptions& o)>;

// Options without a value; true when `arg` is one (and sets it).
bool FlagOption(const std::string& arg, LaunchOptions& o) {
  if (arg == "--tee") {
    o.tee = true;
  } else if (arg == "--fallback-report") {
    o.fallback_report = true;
  } else if (arg == "--no-python") {
    o.no_python = true;
  } else if (arg == "--standalone") {
    o.standalone = true;
  } else {
    return false;
  }
  return true;
}

// Options that take a value, by every spelling.
const std::map<std::string, Setter>& ValueOptions() {
  static const std::map<std::string, Setter> options = [] {
    std::map<std::string, Setter> m;
    Setter nproc = [](const std::string& f, const std::string& v, LaunchOptions& o) {
      o.nproc_per_node = static_cast<std::uint32_t>(ParseUnsigned(f, v, 1, 1024));
    };
    m["-n"] = nproc;
    m["--nproc-per-node"] = nproc;
    m["--nnodes"] = [](const std::string& f, const std::string& v, LaunchOptions& o) {
      o.nnodes = static_cast<std::uint32_t>(ParseUnsigned(f, v, 1, 4096));
    };
    m["--node-rank"] = [](const std::string& f, const std::string& v, LaunchOptions& o) {
      o.node_rank = static_cast<std::uint32_t>(ParseUnsigned(f, v, 0, 4095));
    };
    m["--rdzv-endpoint"] = [](const std::string&, const std::string& v,
                              LaunchOptions& o) { ParseEndpoint(v, o); };
    m["--rdzv-timeout"] = [](const std::string& f, const std::string& v,
                             LaunchOptions& o) {
      o.rdzv_timeout = std::chrono::seconds(
          static_cast<long>(ParseUnsigned(f, v, 1, 86400)));
    };
    m["--rdzv-secret-file"] = [](const std::string&, const std::string& v,
                                 LaunchOptions& o) { o.rdzv_secret_file = v; };
    m["--master-port"] = [](const std::string& f, const std::string& v,
                            LaunchOptions& o) {
      o.master_port = static_cast<std::uint16_t>(ParseUnsigned(f, v, 1, 65535));
    };
    m["--max-restarts"] = [](const std::string& f, const std::string& v,
                             LaunchOptions& o) {
      o.max_restarts = static_cast<std::uint32_t>(ParseUnsigned(f, v, 0, 1000));
    };
    m["--log-dir"] = [](const std::string&, const std::string& v, LaunchOptions& o) {
      o.log_dir = v;
    };
    m["--topology"] = [](const std::string&, const std::string& v, LaunchOptions& o) {
      o.topology_file = v;
    };
    m["--device"] = [](const std::string&, const std::string& v, LaunchOptions& o) {
      o.device_file = v;
    };
    m["--rdzv-backend"] = [](const std::string& f, const std::string& v, LaunchOptions&) {
      // torchrun's; neuronrun's agents always meet through node 0's store.
      NEURON_CHECK(v == "c10d" || v == "static", f, " '", v,
                   "': neuronrun's rendezvous is node 0's authenticated store "
                   "(c10d or static are accepted as that)");
    };
    Setter run_id = [](const std::string& f, const std::string& v, LaunchOptions& o) {
      NEURON_CHECK(!v.empty() && v.find('/') == std::string::npos &&
                       v.find_first_of(" \t\n") == std::string::npos,
                   f, " must be non-empty without '/' or spaces, got '", v, "'");
      o.run_id = v;
    };
    m["--run-id"] = run_id;
    m["--rdzv-id"] = run_id;
    m["--python"] = [](const std::string&, const std::string& v, LaunchOptions& o) {
      o.python = v;
    };
    m["--preload"] = [](const std::string&, const std::string& v, LaunchOptions& o) {
      if (!v.empty()) ParsePreload(v, "--preload");  // a bad name is refused here, naming it
      o.preload = v;
    };
    m["--bind-to"] = [](const std::string& f, const std::string& v, LaunchOptions& o) {
      NEURON_CHECK(v == "core" || v == "none" || v == "auto", f,
                   " expects core, none or auto, got '", v, "'");
      o.bind_to = v;
    };
    m["--grace-period"] = [](const std::string& f, const std::string& v,
                             LaunchOptions& o) {
      o.grace_period = std::chrono::milliseconds(
          static_cast<long>(ParseSeconds(f, v) * 1000));
    };
    return m;
  }();
  return options;
}

}  // namespace

LaunchOptions ParseOptions(int argc, const char* const* argv) {
  LaunchOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    std::string value;
    bool has_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    // torchrun spells every option with '-' or '_' (--nproc_per_node).
    std::replace(arg.begin(), arg.end(), '_', '-');
    if (!has_value && FlagOption(arg, o)) continue;
    if (arg == "-m" || arg == "--module") {
      o.module = true;
      continue;  // the program that follows is the module's name
    }
    const auto& options = ValueOptions();
    const auto it = options.find(arg);
    NEURON_CHECK(it != options.end(), "unknown option '", arg, "'");
    if (!has_value) {
      NEURON_CHECK(i + 1 < argc, "option ", arg, " needs a value");
      value = argv[++i];
    }
    it->second(arg, value, o);
  }
  NEURON_CHECK(i < argc, "no program given: neuronrun [options] SCRIPT.py|EXECUTABLE [args...]");
  o.program = argv[i++];
  for (; i < argc; ++i) o.program_args.emplace_back(argv[i]);
  return o;
}

void ValidateOptions(const LaunchOptions& o) {
  NEURON_CHECK(o.node_rank < o.nnodes, "--node-rank ", o.node_rank,
               " must be less than --nnodes ", o.nnodes);
  NEURON_CHECK(o.nnodes == 1 || !o.rdzv_host.empty(),
               "--nnodes ", o.nnodes, " needs --rdzv-endpoint HOST:PORT (node 0's address)");
  NEURON_CHECK(!o.tee || !o.log_dir.empty(), "--tee needs --log-dir");
  NEURON_CHECK(!o.standalone || o.nnodes == 1, "--standalone is a single-node job; got --nnodes ",
               o.nnodes);
  NEURON_CHECK(!(o.module && o.no_python), "-m runs a module under Python: it cannot be "
               "combined with --no-python");
  if (o.module) {
    NEURON_CHECK(!o.program.empty() && o.program.find('/') == std::string::npos,
                 "-m expects a module name (a.b.c), got '", o.program, "'");
  } else if (RunsUnderPython(o)) {
    struct stat st {};
    NEURON_CHECK(::stat(o.program.c_str(), &st) == 0 && S_ISREG(st.st_mode),
                 "script '", o.program, "' does not exist");
    NEURON_CHECK(::access(o.program.c_str(), R_OK) == 0, "script '", o.program,
                 "' is not readable");
  } else if (o.program.find('/') != std::string::npos) {
    NEURON_CHECK(!ResolveProgram(o.program).empty(), "program '", o.program,
                 "' does not exist or is not executable");
    CheckInterpreter(o.program);
  }
}

bool RunsUnderPython(const LaunchOptions& o) {
  return o.module || (!o.no_python && IsPythonScript(o.program));
}

bool IsPythonScript(const std::string& program) {
  const std::string suffix = ".py";
  return program.size() >= suffix.size() &&
         program.compare(program.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// neuronrun --help: the options, the environment and the exit status.
constexpr char kHelpText[] = R"(usage: neuronrun [options] SCRIPT.py|EXECUTABLE [args...]
       neuronrun [options] -m MODULE [args...]
       neuronrun matrix FILE [--out DIR]   (a scaling test matrix; matrix --help)
       neuronrun replay TRACE_DIR [...]    (replay recorded traces; replay --help)
       neuronrun predict --model FILE ...  (a full-size step, predicted; predict --help)
       neuronrun zygote -- COMMAND ...     (one zygote for COMMAND's jobs; zygote --help)
       neuronrun --help

Starts the ranks of a distributed job on this node, gives each the
torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
OMP_NUM_THREADS=1 unless set) plus NEURON_* placement variables, prefixes
every output line with "[rank N]: ", and ends the whole job when one rank
fails. A SCRIPT.py runs under the Python interpreter that has torch; any other
program runs directly (looked up on PATH when it has no '/'). torchrun's
command lines work as they are: every option may be spelled with '_' for
'-' (--nproc_per_node), and -m/--module, --no-python, --standalone,
--node_rank, --rdzv_endpoint, --rdzv_id and --rdzv_backend are taken.

Program:
  -m, --module             run MODULE as `python -m MODULE`
  --no-python              run the program directly, even a .py file

Job shape:
  -n, --nproc-per-node N   ranks on this node (default 1)
  --nnodes N               nodes in the job (default 1); one neuronrun per node
  --node-rank R            this node's index, 0..N-1 (default 0)
  --rdzv-endpoint HOST:PORT
                           node 0's rendezvous address; node 0 serves it on
                           that interface, the others connect (needed when
                           --nnodes > 1)
  --rdzv-timeout SECONDS   how long to wait for every node (default 300)
  --rdzv-secret-file FILE  secret shared by the nodes' agents (multi-node);
                           default: $NEURON_RDZV_SECRET, else
                           ~/.config/torchneuron/rdzv-secret (created 0600)
  --master-port PORT       port for MASTER_PORT on node 0 (default: a free
                           port chosen at start; never a fixed one)
  --run-id, --rdzv-id ID   job id, TORCHELASTIC_RUN_ID (default: random)
  --standalone             a single-node job with a rendezvous of its own
                           (what neuronrun always does without --nnodes)
  --rdzv-backend c10d|static
                           accepted for torchrun's command lines; the
                           rendezvous is always node 0's authenticated store

Fault handling:
  --max-restarts K         restart the whole job up to K times after a
                           failure (TORCHELASTIC_RESTART_COUNT counts them),
                           0.5 s after the first failure, doubling, at most
                           30 s
  --grace-period SECONDS   time between SIGTERM and SIGKILL when stopping
                           ranks (default 5)
  --bind-to core|none|auto pin each rank to one of this node's CPUs (rank i
                           to the i-th allowed CPU, modulo) or not; auto
                           (default): core when the ranks fit the CPUs

Output:
  --log-dir DIR            write each rank's output to
                           DIR/attempt_K/rank_N.{stdout,stderr}
  --tee                    with --log-dir, also print to the console
  --fallback-report        each rank prints, at exit, the CPU fallbacks it
                           ran on "neuron" (count, modelled cost, share,
                           source line); sets NEURON_FALLBACK_REPORT=1

Simulated fabric:
  --topology FILE          fabric topology (protobuf text, configs/topologies/);
                           default: the embedded trn2 node (16 chips)
  --device FILE            NeuronCore spec the ranks model (protobuf text,
                           configs/devices/; sets NEURON_DEVICE_FILE):
                           neuroncore-v2 for trn1, v3 for trn2, v4 for
                           trn3; default: $NEURON_DEVICE_FILE, else the
                           embedded NeuronCore-v3
  --python PATH            interpreter for .py scripts (default:
                           $NEURON_PYTHON, else the Python
                           neuronrun was built with)
  --preload MODULE[,MODULE...]
                           import the modules once in one interpreter (a
                           zygote) and fork each Python rank from it, so
                           no rank spends seconds on `import torch`
                           (default: $NEURON_PRELOAD; empty: none). The
                           modules must not read per-rank variables at
                           import nor start threads; if the zygote cannot
                           serve, the ranks start as fresh interpreters.
                           Under `neuronrun zygote` ($NEURON_ZYGOTE) the
                           job uses that zygote when it imported the
                           modules with the ranks' settings

When a rank exits non-zero or dies by a signal, neuronrun sends SIGTERM to
every other rank (SIGKILL after the grace period), prints a summary naming
the rank, its exit code or signal and the last 20 lines of its stderr, and
exits with that rank's code (128+signal for a signal). SIGINT or SIGTERM to
neuronrun goes to every rank; a second SIGINT kills them at once. When an
attempt ends, processes the ranks left running are killed, those that left
their rank's process group (setsid) too, named on stderr. If neuronrun
itself is killed, its watchdog kills the ranks' process groups and every
process whose environment holds the ranks' NEURON_AGENT_ID.

Exit status: 0 when every rank succeeded; the failing rank's status; 2 for
bad usage or a job that cannot start (unknown option, missing program,
unreachable rendezvous, port in use, bad topology).
)";

std::string HelpText() { return kHelpText; }

}  // namespace neuron::launcher
