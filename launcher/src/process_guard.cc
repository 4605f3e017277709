#include "process_guard.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "strays.h"

namespace neuron::launcher {

namespace {

// The watchdog: a plain loop over the pipe, then the kills.
[[noreturn]] void Watch(int read_fd, const std::string& marker) {
  // Detach from the terminal's Ctrl-C and from neuronrun's output.
  ::setpgid(0, 0);
  const int devnull = ::open("/dev/null", O_RDWR);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(devnull, fd);
  ::close_range(4, ~0U, 0);  // everything but the pipe, moved to fd 3
  std::set<pid_t> groups;
  std::int32_t message;
  while (true) {
    const ssize_t n = ::read(read_fd, &message, sizeof(message));
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof(message)) break;  // EOF: neuronrun is gone
    if (message > 0) {
      groups.insert(message);
    } else {
      groups.erase(-message);
    }
  }
  for (pid_t group : groups) ::kill(-group, SIGKILL);
  KillProcessesCarrying(marker);
  ::_exit(0);
}

}  // namespace

ProcessGuard::ProcessGuard()
    : agent_id_(collectives::auth::GenerateSecret().substr(0, 32)) {
  const std::string marker =
      StrCat(runtime::VariableName(runtime::ConfigKey::kAgentId), "=", agent_id_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw IoError(StrCat("pipe2 failed: ", std::strerror(errno)));
  }
  watchdog_ = ::fork();
  if (watchdog_ < 0) throw IoError(StrCat("fork failed: ", std::strerror(errno)));
  if (watchdog_ == 0) {
    ::close(fds[1]);
    const int keep = ::dup2(fds[0], 3) < 0 ? fds[0] : 3;
    if (keep == 3 && fds[0] != 3) ::close(fds[0]);
    Watch(keep, marker);
  }
  ::close(fds[0]);
  pipe_ = fds[1];
}

ProcessGuard::~ProcessGuard() {
  if (pipe_ >= 0) ::close(pipe_);
  if (watchdog_ > 0) ::waitpid(watchdog_, nullptr, 0);
}

void ProcessGuard::Register(pid_t group) {
  const std::int32_t message = group;
  ssize_t ignored = ::write(pipe_, &message, sizeof(message));
  (void)ignored;
}

void ProcessGuard::Unregister(pid_t group) {
  const std::int32_t message = -group;
  ssize_t ignored = ::write(pipe_, &message, sizeof(message));
  (void)ignored;
}

}  // namespace neuron::launcher
