#include "exit_status.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "neuron/runtime/error.h"

namespace neuron::launcher {

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev
                           : "signal " + std::to_string(sig);
}

int ShellExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool Succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string DescribeExit(int status, bool killed_by_us) {
  if (WIFEXITED(status)) return StrCat("exited with code ", WEXITSTATUS(status));
  if (!WIFSIGNALED(status)) return StrCat("ended with wait status ", status);
  const int sig = WTERMSIG(status);
  std::string text = StrCat("was killed by ", SignalName(sig), " (signal ", sig, ")");
  if (sig == SIGKILL && !killed_by_us) {
    text += " from outside, possibly out of memory";
  }
  return text;
}

}  // namespace neuron::launcher
