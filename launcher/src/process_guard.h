// A watchdog process that outlives neuronrun by a moment: it learns the
// process group of every rank over a pipe, and when the pipe closes
// (neuronrun exited or was SIGKILLed) it SIGKILLs every group still
// registered, then every process whose environment holds this agent's
// NEURON_AGENT_ID (agent_id(), which the ranks are given): those the ranks
// started outside their groups (setsid, daemons). PR_SET_PDEATHSIG covers
// the ranks themselves; the group kill what stayed in a rank's group (data
// loader workers, shells).
#pragma once

#include <sys/types.h>

#include <string>

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
  // 32 random hex digits, drawn before the fork: the ranks' NEURON_AGENT_ID.
  const std::string& agent_id() const { return agent_id_; }

 private:
  std::string agent_id_;
  int pipe_ = -1;
  pid_t watchdog_ = -1;
};

}  // namespace neuron::launcher
