#include "strays.h"

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace neuron::launcher {

namespace {

// Rounds of scan-and-kill: a stray may fork while the previous round kills.
constexpr int kRounds = 5;

// At most `limit` bytes of a /proc file ("" when it is gone).
std::string ReadProc(const std::string& path, std::size_t limit) {
  std::string text(limit, '\0');
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  text.resize(std::fread(text.data(), 1, limit, f));
  std::fclose(f);
  return text;
}

struct Status {
  pid_t parent = 0;
  pid_t group = 0;
  unsigned long long start = 0;  // clock ticks after boot: tells a reused pid apart
};

// A live process's status from /proc/PID/stat; false when it is gone or a
// zombie (it has exited: only its parent's wait is missing).
bool ReadStatus(pid_t pid, Status* status) {
  // "PID (COMM) STATE PPID PGRP ... STARTTIME(22) ...": COMM may hold spaces.
  const std::string stat = ReadProc("/proc/" + std::to_string(pid) + "/stat", 1024);
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  std::istringstream fields(stat.substr(paren + 2));
  char state = 0;
  fields >> state >> status->parent >> status->group;
  std::string skip;
  for (int field = 6; field < 22 && fields; ++field) fields >> skip;
  fields >> status->start;
  return fields && state != 'Z' && state != 'X';
}

std::map<pid_t, Status> LiveProcesses() {
  std::map<pid_t, Status> processes;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return processes;
  while (dirent* entry = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    Status status;
    if (pid > 0 && ReadStatus(pid, &status)) processes.emplace(pid, status);
  }
  ::closedir(proc);
  return processes;
}

// SIGKILL through a pidfd opened on the process found by the scan (same
// start time), so a pid reused since is never hit.
bool KillIfSame(pid_t pid, const Status& seen) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return false;  // gone
  Status now;
  const bool same = ReadStatus(pid, &now) && now.start == seen.start;
  const bool killed =
      same && ::syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0) == 0;
  ::close(fd);
  return killed;
}

// One round: the descendants of this process found now, killed.
std::vector<Stray> KillRound(pid_t keep, const std::set<pid_t>& skip_groups) {
  const auto processes = LiveProcesses();
  std::multimap<pid_t, pid_t> children;
  for (const auto& [pid, status] : processes) children.emplace(status.parent, pid);
  std::vector<Stray> killed;
  std::vector<pid_t> frontier = {::getpid()};
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    const auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      const pid_t pid = it->second;
      if (pid == keep) continue;
      frontier.push_back(pid);
      const Status& status = processes.at(pid);
      if (skip_groups.count(status.group) != 0)
        continue;  // its rank's group kill ends it
      std::string name = ReadProc("/proc/" + std::to_string(pid) + "/comm", 64);
      if (!name.empty() && name.back() == '\n') name.pop_back();
      if (KillIfSame(pid, status)) killed.push_back({pid, name});
    }
  }
  return killed;
}

// Whether `pid`'s initial environment holds `entry`, read in pieces up to
// kMaxEnvironBytes (an entry is NUL-terminated; the first follows nothing).
bool Carries(pid_t pid, const std::string& entry) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/environ").c_str(), "r");
  if (f == nullptr) return false;  // gone, or another user's
  const std::string needle = std::string(1, '\0') + entry + std::string(1, '\0');
  std::string window(1, '\0');  // as if a NUL came before the first entry
  char piece[16384];
  std::size_t total = 0;
  bool found = false;
  while (!found && total < kMaxEnvironBytes) {
    const std::size_t n =
        std::fread(piece, 1, std::min(sizeof(piece), kMaxEnvironBytes - total), f);
    if (n == 0) break;
    total += n;
    window.append(piece, n);
    found = window.find(needle) != std::string::npos;
    // Keep what a match across the next piece's start may begin with.
    if (window.size() > needle.size()) window.erase(0, window.size() - needle.size());
  }
  std::fclose(f);
  return found;
}

}  // namespace

int KillProcessesCarrying(const std::string& entry) {
  // Each process once: one killed may still be on its way out next round.
  std::set<std::pair<pid_t, unsigned long long>> killed;
  for (int round = 0; round < kRounds; ++round) {
    bool more = false;
    for (const auto& [pid, status] : LiveProcesses()) {
      if (pid == ::getpid() || killed.count({pid, status.start}) != 0 ||
          !Carries(pid, entry) || !KillIfSame(pid, status))
        continue;
      killed.insert({pid, status.start});
      more = true;
    }
    if (!more) break;
  }
  return static_cast<int>(killed.size());
}

std::vector<Stray> KillStrayDescendants(pid_t keep, const std::set<pid_t>& skip_groups) {
  std::vector<Stray> strays;
  for (int round = 0; round < kRounds; ++round) {
    const auto killed = KillRound(keep, skip_groups);
    if (killed.empty()) break;
    strays.insert(strays.end(), killed.begin(), killed.end());
  }
  // Reap those that are (or, their parent killed, became) our children.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (const Stray& s : strays) {
    while (::waitpid(s.pid, nullptr, WNOHANG) == 0 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return strays;
}

}  // namespace neuron::launcher
