// Processes a job leaves behind outside its ranks' process groups: a rank's
// child that called setsid() or setpgid() (a daemon, `setsid cmd &`) is
// missed by the kill of the rank's group. neuronrun is a child subreaper, so
// every such process is still its descendant (orphans are re-parented to
// it); KillStrayDescendants finds them through /proc and ends them. If
// neuronrun is killed, its watchdog finds them by the environment variable
// their rank was given (KillProcessesCarrying).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace neuron::launcher {

struct Stray {
  pid_t pid;
  std::string name;  // the command name (/proc/PID/comm)
};

// SIGKILLs every descendant of this process but `keep` (the watchdog) and
// the members of `skip_groups` (the ranks' process groups, killed as a
// whole already and maybe still exiting), rescanning for ones forked
// meanwhile, and reaps those that are its children; returns them. Call
// once the ranks have finished.
std::vector<Stray> KillStrayDescendants(pid_t keep, const std::set<pid_t>& skip_groups);

// SIGKILLs every live process but this one whose initial environment
// (/proc/PID/environ, read up to kMaxEnvironBytes) holds the entry
// `entry` ("NAME=value") exactly, rescanning (up to 5 rounds) for ones
// forked meanwhile; returns how many it killed. For the watchdog, once neuronrun is gone:
// its strays are no longer its descendants then (they were re-parented
// away), but they still carry the variable neuronrun gave their rank. A
// process of another user, or one that cleared its environment or
// exec'ed with a new one, is not found.
constexpr std::size_t kMaxEnvironBytes = 4 << 20;
int KillProcessesCarrying(const std::string& entry);

}  // namespace neuron::launcher
