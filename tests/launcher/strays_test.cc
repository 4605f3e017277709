// Finding a job's processes by an environment entry (launcher/src/strays.h).
#include "strays.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

namespace neuron::launcher {
namespace {

// A child that sleeps with `env` as its whole environment.
pid_t SleepWith(std::vector<std::string> env) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>("/bin/sleep"), const_cast<char*>("30"), nullptr};
    ::execve("/bin/sleep", argv, envp.data());
    ::_exit(127);
  }
  return pid;
}

// Whether `pid` runs /bin/sleep within a few seconds.
bool Execed(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    if (std::getline(comm, name) && name == "sleep") return true;
    ::usleep(10000);
  }
  return false;
}

// Whether `pid` ended by SIGKILL within a few seconds (else it is killed).
bool KilledBySigkill(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 300; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return false;
}

// The entry is matched whole, wherever it lies in the environment: first,
// after 40 KB of another variable (past the first piece read), last, or
// across two pieces;
// an entry it is a prefix of, or a name that ends with it, is not it.
TEST(Strays, ProcessesCarryingAnEntryExactlyAreKilled) {
  const std::string entry = "NEURON_AGENT_ID=5eed" + std::to_string(::getpid());
  const std::string big = "BIG=" + std::string(40000, 'x');
  std::vector<pid_t> carriers = {
      SleepWith({entry, "PATH=/bin"}),
      SleepWith({"PATH=/bin", big, entry}),
      SleepWith({big, entry, "Z=1"}),
  };
  // Across the border of two of the reader's 16 KiB pieces, by a byte or more.
  for (std::size_t before : {1, 2, 7, 20}) {
    carriers.push_back(
        SleepWith({"P=" + std::string(2 * 16384 - before - 3, 'p'), entry}));
  }
  const std::vector<pid_t> others = {
      SleepWith({entry + "0", "PATH=/bin"}),
      SleepWith({"X" + entry}),
      SleepWith({big}),
  };
  // /proc shows a child's own environment once it has exec'ed.
  for (pid_t pid : carriers) ASSERT_TRUE(Execed(pid)) << pid;
  for (pid_t pid : others) ASSERT_TRUE(Execed(pid)) << pid;
  EXPECT_EQ(KillProcessesCarrying(entry), static_cast<int>(carriers.size()));
  for (pid_t pid : carriers) EXPECT_TRUE(KilledBySigkill(pid)) << pid;
  for (pid_t pid : others) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << pid << " was killed";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
}

}  // namespace
}  // namespace neuron::launcher
