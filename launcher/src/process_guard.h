// A watchdog process that outlives neuronrun by a moment: it learns the
// process group of every rank over a pipe, and when the pipe closes
// (neuronrun exited or was SIGKILLed) it SIGKILLs every group still
// registered. PR_SET_PDEATHSIG covers the ranks themselves; the guard covers
// what the ranks started (data loader workers, shells), which stay in their
// rank's process group.
#pragma once

#include <sys/types.h>

namespace neuron::launcher {

class ProcessGuard {
 public:
  // Forks the watchdog. Call before starting threads or ranks.
  ProcessGuard();
  // Closes the pipe: the watchdog kills what is still registered and exits.
  ~ProcessGuard();
  ProcessGuard(const ProcessGuard&) = delete;
  ProcessGuard& operator=(const ProcessGuard&) = delete;

  void Register(pid_t process_group);
  // The group is gone (its rank finished and was reaped).
  void Unregister(pid_t process_group);
  pid_t watchdog() const { return watchdog_; }

 private:
  int pipe_ = -1;
  pid_t watchdog_ = -1;
};

}  // namespace neuron::launcher
