// Runs neuronrun as a real process for the end-to-end tests: output to
// files, exit status, elapsed time, signals, and the processes of a job
// found by their TORCHELASTIC_RUN_ID.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace neuron::launcher::testing {

class LauncherProcess {
 public:
  // Starts NEURONRUN_PATH with `args`; `env` entries are added to (or
  // override) the test's own environment.
  explicit LauncherProcess(const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& env = {});
  ~LauncherProcess();

  // Waits for exit; returns the shell-style status (128+signal if killed),
  // or -1 after `timeout` (the process is then SIGKILLed).
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  void Signal(int sig);
  // Waits until stdout contains `n` occurrences of `text`.
  bool WaitForOutput(const std::string& text, int n, std::chrono::milliseconds timeout);

  std::string Stdout() const;
  std::string Stderr() const;
  double ElapsedSeconds() const { return elapsed_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  std::chrono::steady_clock::time_point start_;
  double elapsed_ = 0;
  bool exited_ = false;
};

// Pids of live processes whose environment has TORCHELASTIC_RUN_ID=run_id.
std::vector<pid_t> ProcessesOfJob(const std::string& run_id);

// Waits up to `timeout` for the job's processes to disappear; returns the
// survivors.
std::vector<pid_t> WaitNoProcessesOfJob(const std::string& run_id,
                                        std::chrono::milliseconds timeout);

// The lines of `text`.
std::vector<std::string> Lines(const std::string& text);

// A TCP port that is free now.
int FreePort();

}  // namespace neuron::launcher::testing
