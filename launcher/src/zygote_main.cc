#include "zygote_main.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "child_process.h"
#include "exit_status.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "rank_env.h"
#include "zygote.h"

namespace neuron::launcher {

namespace {

constexpr int kUsageError = 2;

constexpr const char* kHelp =
    "usage: neuronrun zygote [--preload MODULE[,MODULE...]] -- COMMAND [ARGS...]\n"
    "Runs COMMAND with one zygote for all the neuronrun jobs it starts: an interpreter\n"
    "that imported MODULES once (default: $NEURON_PRELOAD if set, else the trainers'\n"
    NEURON_TRAINER_MODULES ")\n"
    "and listens on a socket of this user's (NEURON_ZYGOTE, set for COMMAND). A job\n"
    "run with --preload forks its Python ranks from there when the zygote imported\n"
    "its modules with the environment the job's ranks get (else it starts its own).\n"
    "Exit status: COMMAND's (128 + signal for a signal), 2 for bad usage.\n"
    "\n"
    "usage: neuronrun zygote exec ARGS...\n"
    "Runs python ARGS (NEURON_PYTHON; SCRIPT, -m MODULE or -c CODE) with the environment\n"
    "a rank gets (OMP_NUM_THREADS=1 and PYTHONUNBUFFERED=1 unless set, the build's package\n"
    "on PYTHONPATH): forked from the zygote of NEURON_ZYGOTE when it imported with\n"
    "that environment (and NEURON_PRELOAD's modules, if set; set empty: never), else a\n"
    "fresh interpreter.\n"
    "Exit status: python's (128 + signal for a signal).\n";

// Where SIGINT and SIGTERM go on to: COMMAND's pid, or (negative) the
// process group of a process the zygote forked.
pid_t child_pid = 0;

void ForwardSignal(int sig) {
  if (child_pid != 0) ::kill(child_pid, sig);
}

// Runs `command` with `env`, stdio inherited; waits for it, reaping any
// orphan that comes to this subreaper meanwhile. Returns its status.
int RunCommand(const std::vector<std::string>& command, const Environment& env) {
  const std::vector<std::string> envp = ToEnvp(env);
  std::vector<char*> argv = CStrings(command), envv = CStrings(envp);
  child_pid = ::fork();
  if (child_pid == 0) {
    ::execvpe(argv[0], argv.data(), envv.data());
    std::cerr << "neuronrun zygote: cannot run " << command[0] << ": " << std::strerror(errno)
              << std::endl;
    ::_exit(127);
  }
  if (child_pid < 0) throw IoError(StrCat("fork failed: ", std::strerror(errno)));
  ::signal(SIGTERM, ForwardSignal);
  ::signal(SIGINT, ForwardSignal);
  int status = 0;
  while (true) {
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid == child_pid) break;
    if (pid < 0 && errno != EINTR) throw IoError(StrCat("waitpid: ", std::strerror(errno)));
  }
  return ShellExitCode(status);
}

// The zygote, listening at `socket`; nullptr (said on stderr) when it
// cannot start: COMMAND then runs without it.
std::unique_ptr<Zygote> StartZygote(const std::vector<std::string>& modules,
                                    const std::string& socket) {
  try {
    return StartSharedZygote(modules, socket);
  } catch (const Error& e) {
    std::cerr << "neuronrun zygote: " << e.what() << "; the command runs without it"
              << std::endl;
    return nullptr;
  }
}

// The shared zygote of NEURON_ZYGOTE if it serves a process of this
// environment (and imported NEURON_PRELOAD's modules, if it is set), else
// nullptr; NEURON_PRELOAD set empty asks for a fresh interpreter.
std::unique_ptr<Zygote> ServingZygote(const std::vector<std::string>& env) {
  const auto& config = runtime::ConfigRegistry::Get();
  const std::string socket = config.GetString(runtime::ConfigKey::kZygote);
  const std::string list = config.GetString(runtime::ConfigKey::kPreload);
  if (socket.empty() || (list.empty() && config.IsSet(runtime::ConfigKey::kPreload))) {
    return nullptr;
  }
  try {
    auto zygote = Zygote::ConnectTo(socket);
    const auto modules = list.empty() ? std::vector<std::string>{}
                                      : ParsePreload(list, "NEURON_PRELOAD");
    if (zygote->Refusal(modules, env).empty()) return zygote;
  } catch (const Error& e) {
    std::cerr << "neuronrun zygote exec: " << e.what() << std::endl;
  }
  return nullptr;
}

// Waits for a process forked by `zygote` (not our child) through its
// status pipe, passing SIGINT and SIGTERM on to its process group.
int AwaitForked(const SpawnedChild& child) {
  child_pid = -child.pid;
  ::signal(SIGTERM, ForwardSignal);
  ::signal(SIGINT, ForwardSignal);
  ::fcntl(child.status_fd, F_SETFL, 0);  // blocking
  int status = SIGKILL;  // no status: its keeper died, and it with it
  std::size_t got = 0;
  while (got < sizeof(status)) {
    const ssize_t n = ::read(child.status_fd, reinterpret_cast<char*>(&status) + got,
                             sizeof(status) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      status = SIGKILL;
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(child.status_fd);
  return ShellExitCode(status);
}

// neuronrun zygote exec ARGS...: python ARGS, forked from the shared zygote
// when one serves it, else exec'ed.
int ExecMain(int argc, char** argv) {
  const std::string python =
      ResolveProgram(runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPython));
  if (python.empty()) {
    std::cerr << "neuronrun zygote exec: no python interpreter (NEURON_PYTHON)" << std::endl;
    return 127;
  }
  SpawnRequest request;
  request.path = python;
  request.argv = {python};
  for (int i = 0; i < argc; ++i) request.argv.push_back(argv[i]);
  // As for a rank, forked or not: the zygote imported with it.
  request.env = ToEnvp(InterpreterEnvironment(CurrentEnvironment(), NEURON_PYTHON_PACKAGE_DIR));
  request.inherit_stdio = true;
  if (auto zygote = request.argv.size() > 1 ? ServingZygote(request.env) : nullptr) {
    try {
      return AwaitForked(zygote->Spawn(request));
    } catch (const Error& e) {
      std::cerr << "neuronrun zygote exec: " << e.what() << "; running " << python << std::endl;
    }
  }
  ::execve(python.c_str(), CStrings(request.argv).data(), CStrings(request.env).data());
  std::cerr << "neuronrun zygote exec: cannot run " << python << ": " << std::strerror(errno)
            << std::endl;
  return 127;
}

}  // namespace

int ZygoteMain(int argc, char** argv) {
  if (argc >= 1 && std::string(argv[0]) == "exec") return ExecMain(argc - 1, argv + 1);
  std::string list = SharedZygoteModules();
  std::vector<std::string> command;
  std::vector<std::string> modules;
  try {
    int i = 0;
    for (; i < argc && std::string(argv[i]) != "--"; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::cout << kHelp;
        return 0;
      }
      NEURON_CHECK(a == "--preload" && i + 1 < argc, "neuronrun zygote: unknown argument '", a,
                   "'");
      list = argv[++i];
    }
    for (++i; i < argc; ++i) command.push_back(argv[i]);
    NEURON_CHECK(!command.empty(), "neuronrun zygote: no COMMAND after --");
    if (!list.empty()) modules = ParsePreload(list, "--preload");
  } catch (const Error& e) {
    std::cerr << "neuronrun: error: " << e.what() << "\n" << kHelp;
    return kUsageError;
  }
  char dir_template[] = "/tmp/neuronrun-zygote-XXXXXX";  // 0700: this user's alone
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) {
    std::cerr << "neuronrun zygote: mkdtemp: " << std::strerror(errno) << std::endl;
    return 1;
  }
  const std::string socket = std::string(dir) + "/socket";
  std::unique_ptr<Zygote> zygote = modules.empty() ? nullptr : StartZygote(modules, socket);
  Environment env = CurrentEnvironment();
  if (zygote) env[runtime::VariableName(runtime::ConfigKey::kZygote)] = socket;
  int status = 127;
  try {
    status = RunCommand(command, env);
  } catch (const Error& e) {
    std::cerr << "neuronrun zygote: " << e.what() << std::endl;
  }
  zygote.reset();  // after its keepers, once COMMAND's jobs are over
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return status;
}

}  // namespace neuron::launcher
