#include "launcher_process.h"

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace neuron::launcher::testing {

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

LauncherProcess::LauncherProcess(const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& env) {
  char tmpl[] = "/tmp/neuronrun_test_XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  std::map<std::string, std::string> all;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) all[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) all[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : all) env_strings.push_back(k + "=" + v);
  std::vector<std::string> argv_strings = {NEURONRUN_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
  start_ = std::chrono::steady_clock::now();
  pid_ = ::fork();
  if (pid_ == 0) {
    std::freopen(out.c_str(), "w", stdout);
    std::freopen(err.c_str(), "w", stderr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

LauncherProcess::~LauncherProcess() {
  if (!exited_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::system(("rm -rf " + dir_).c_str());
}

int LauncherProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      elapsed_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
                     .count();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      exited_ = true;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void LauncherProcess::Signal(int sig) { ::kill(pid_, sig); }

bool LauncherProcess::WaitForOutput(const std::string& text, int n,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string out = Stdout();
    int count = 0;
    for (auto pos = out.find(text); pos != std::string::npos;
         pos = out.find(text, pos + 1)) {
      ++count;
    }
    if (count >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string LauncherProcess::Stdout() const { return ReadFile(dir_ + "/stdout"); }
std::string LauncherProcess::Stderr() const { return ReadFile(dir_ + "/stderr"); }

std::vector<pid_t> ProcessesOfJob(const std::string& run_id) {
  const std::string needle = "TORCHELASTIC_RUN_ID=" + run_id;
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  while (dirent* entry = ::readdir(proc)) {
    const pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    const std::string environ_text =
        ReadFile("/proc/" + std::string(entry->d_name) + "/environ");
    std::stringstream vars(environ_text);
    std::string var;
    bool match = false;
    while (std::getline(vars, var, '\0')) match = match || var == needle;
    if (!match) continue;
    // A zombie has exited already; only its parent's wait is missing.
    const std::string stat = ReadFile("/proc/" + std::string(entry->d_name) + "/stat");
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') {
      continue;
    }
    pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

std::vector<pid_t> WaitNoProcessesOfJob(const std::string& run_id,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pids = ProcessesOfJob(run_id);
  while (!pids.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pids = ProcessesOfJob(run_id);
  }
  return pids;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream s(text);
  std::string line;
  while (std::getline(s, line)) lines.push_back(line);
  return lines;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace neuron::launcher::testing
