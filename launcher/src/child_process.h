// Starting one rank (or, for the matrix, one agent): fork + exec with its
// own process group, its stdout and stderr on pipes (or appended to a
// file), stdin on /dev/null, and PR_SET_PDEATHSIG so it dies with
// neuronrun even when neuronrun is SIGKILLed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace neuron::launcher {

struct SpawnRequest {
  std::string path;               // absolute or relative path to execute
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value" entries, the whole environment
  int cpu = -1;                   // >= 0: the child runs on this CPU only
  // Non-empty: stdout and stderr appended to this file instead of pipes.
  std::string output_file;
  // stdout and stderr are neuronrun's stderr (no pipes, no output_file).
  bool inherit_stderr = false;
  // A zygote's (Zygote::Spawn): stdout and stderr are this process's own.
  bool inherit_stdio = false;
  // >= 0: this descriptor of neuronrun stays open in the child, under the
  // same number (every other one above 2 is closed at exec).
  int pass_fd = -1;
};

struct SpawnedChild {
  pid_t pid = -1;   // also its process group id
  int stdout_fd = -1;  // -1 with an output_file
  int stderr_fd = -1;
  // >= 0: not this process's child (a shared zygote's rank, zygote.h): its
  // wait status arrives here, 4 bytes in native order, once it has exited;
  // end of file without them means it was killed with its keeper.
  int status_fd = -1;
};

// Throws IoError naming the program when fork or exec fails (or the
// output file cannot be opened). The returned
// descriptors are non-blocking and close-on-exec; the caller owns them.
SpawnedChild Spawn(const SpawnRequest& request);

// `strings` as exec's argv or envp: their C strings, then nullptr; valid
// while `strings` is.
std::vector<char*> CStrings(const std::vector<std::string>& strings);

// Resolves a program name the way execvp would ("python3" -> /usr/local/bin/python3);
// a name with '/' is used as it is. Empty when there is no such executable.
std::string ResolveProgram(const std::string& name);

}  // namespace neuron::launcher
