#include "child_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <linux/close_range.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::launcher {

namespace {

struct Pipe {
  int read = -1;
  int write = -1;
};

Pipe MakePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw IoError(StrCat("pipe2 failed: ", std::strerror(errno)));
  }
  return {fds[0], fds[1]};
}

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(pid_t parent, int out, int err, const Pipe& status,
                            const char* path, char** argv, char** envp, int cpu,
                            int pass_fd) {
  ::setpgid(0, 0);
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ::sched_setaffinity(0, sizeof(set), &set);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // parent died before prctl
  // Signals are blocked since before fork: reset the parent's handlers
  // (they would write into neuronrun's signal pipe), then unblock.
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) {
    ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  // Sockets and pipes of neuronrun (its store server among them) stay here.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  if (pass_fd >= 0) ::fcntl(pass_fd, F_SETFD, 0);
  ::execve(path, argv, envp);
  const int error = errno;
  ssize_t ignored = ::write(status.write, &error, sizeof(error));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

namespace {
bool IsExecutable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}
}  // namespace

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : "";
  const char* path_env = std::getenv("PATH");
  std::stringstream dirs(path_env ? path_env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

SpawnedChild Spawn(const SpawnRequest& request) {
  // Made in order; if one fails, the ones before it are closed. With an
  // output file, both ends of the output "pipes" are that file.
  std::vector<Pipe> pipes;
  try {
    if (request.inherit_stderr) {
      for (int i = 0; i < 2; ++i) {
        const int fd = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        if (fd < 0) throw IoError(StrCat("dup of stderr failed: ", std::strerror(errno)));
        pipes.push_back({-1, fd});
      }
    } else if (!request.output_file.empty()) {
      const int fd = runtime::OpenForWriting(request.output_file, "output file", O_APPEND);
      pipes.push_back({-1, fd});
      pipes.push_back({-1, ::dup(fd)});
    }
    while (pipes.size() < 3) pipes.push_back(MakePipe());
  } catch (...) {
    for (const Pipe& p : pipes) {
      if (p.read >= 0) ::close(p.read);
      ::close(p.write);
    }
    throw;
  }
  const Pipe out = pipes[0], err = pipes[1], status = pipes[2];
  std::vector<char*> argv = CStrings(request.argv);
  std::vector<char*> envp = CStrings(request.env);
  const pid_t parent = ::getpid();
  // No signal may reach the child before it dropped neuronrun's handlers.
  sigset_t all, previous;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ExecChild(parent, out.write, err.write, status, request.path.c_str(), argv.data(),
              envp.data(), request.cpu, request.pass_fd);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  for (int fd : {out.write, err.write, status.write}) ::close(fd);
  if (pid < 0) {
    for (int fd : {out.read, err.read, status.read}) {
      if (fd >= 0) ::close(fd);
    }
    throw IoError(StrCat("cannot start ", request.path, ": fork failed: ",
                         std::strerror(fork_errno)));
  }
  ::setpgid(pid, pid);  // also in the child: whichever runs first wins
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status.read, &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(status.read);
  if (n == sizeof(exec_errno)) {
    ::waitpid(pid, nullptr, 0);
    for (int fd : {out.read, err.read}) {
      if (fd >= 0) ::close(fd);
    }
    throw IoError(StrCat("cannot execute ", request.path, ": ",
                         std::strerror(exec_errno)));
  }
  for (int fd : {out.read, err.read}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return {pid, out.read, err.read};
}

}  // namespace neuron::launcher
