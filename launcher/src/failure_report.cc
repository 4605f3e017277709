#include "failure_report.h"

#include <sys/wait.h>

#include "exit_status.h"
#include "neuron/runtime/error.h"

namespace neuron::launcher {

proto::JobFailure FailureOfRank(const RankExit& exit, std::uint32_t node_rank,
                                const std::string& hostname) {
  proto::JobFailure f;
  f.set_node_rank(node_rank);
  f.set_hostname(hostname);
  f.set_global_rank(exit.global_rank);
  f.set_local_rank(exit.local_rank);
  f.set_pid(exit.pid);
  f.set_exit_code(ShellExitCode(exit.wait_status));
  f.set_signal(WIFSIGNALED(exit.wait_status) ? WTERMSIG(exit.wait_status) : 0);
  f.set_description(DescribeExit(exit.wait_status, exit.killed_by_us));
  for (const auto& line : exit.stderr_tail) f.add_stderr_tail(line);
  return f;
}

std::string FormatFailure(const proto::JobFailure& f) {
  std::string out;
  if (f.global_rank() < 0) {
    out = StrCat("neuronrun: job failed: ", f.description(), "\n");
    return out;
  }
  out = StrCat("neuronrun: job failed: rank ", f.global_rank(), " (node ", f.node_rank(),
               " on ", f.hostname(), ", local rank ", f.local_rank(), ", pid ", f.pid(),
               ") ", f.description(), "\n");
  if (f.stderr_tail_size() == 0) {
    out += StrCat("neuronrun: rank ", f.global_rank(), " wrote nothing to stderr\n");
    return out;
  }
  out += StrCat("neuronrun: last ", f.stderr_tail_size(), " lines of rank ",
                f.global_rank(), "'s stderr:\n");
  for (const auto& line : f.stderr_tail()) out += "neuronrun:   " + line + "\n";
  return out;
}

}  // namespace neuron::launcher
