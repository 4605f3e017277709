// The local ranks of one attempt: starts them, carries their output to the
// console (prefixed "[rank N]: ", whole lines only) and/or log files, reaps
// them, and stops them on request (SIGTERM, then SIGKILL after a grace).
//
// Runs entirely on the io_context thread of its owner (the Agent), which
// calls Reap() whenever SIGCHLD arrives. A rank is reported finished once
// its process has exited and its pipes are drained, so the stderr tail in
// RankExit is complete.
#pragma once

#include <sys/types.h>

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "child_process.h"
#include "line_splitter.h"
#include "process_guard.h"

namespace neuron::launcher {

struct RankLaunch {
  std::uint32_t global_rank = 0;
  std::uint32_t local_rank = 0;
  SpawnRequest spawn;
};

struct OutputOptions {
  bool console = true;    // prefixed lines on neuronrun's stdout/stderr
  std::string log_dir;    // empty: no files; else rank_N.{stdout,stderr} here
  std::size_t tail_lines = 20;
};

struct RankExit {
  std::uint32_t global_rank = 0;
  std::uint32_t local_rank = 0;
  pid_t pid = -1;
  int wait_status = 0;
  bool killed_by_us = false;  // neuronrun sent the SIGKILL that ended it
  std::vector<std::string> stderr_tail;
};

class RankGroup {
 public:
  using ExitCallback = std::function<void(const RankExit&)>;
  // How a rank is started: launcher::Spawn, or a Zygote's Spawn. The rank
  // ends up a child of this process (zygote.h), or it is a shared zygote's
  // and its wait status comes on SpawnedChild::status_fd.
  using Spawner = std::function<SpawnedChild(const SpawnRequest&)>;

  // `guard` learns every rank's process group for as long as it exists.
  // `on_exit` sees each rank once it has exited and its pipes are drained,
  // in the order the ranks were reaped (so the first failure is the first
  // exit observed, however long each rank's output takes to drain).
  RankGroup(boost::asio::io_context& io, ProcessGuard& guard, OutputOptions output,
            std::vector<RankLaunch> ranks, ExitCallback on_exit,
            Spawner spawn = launcher::Spawn);
  ~RankGroup();

  // Starts every rank; on an IoError the ranks already started are killed.
  void Start();
  // Collects exited children (call on SIGCHLD); reaps orphans too. (A
  // shared zygote's ranks are reported on the io_context without it.)
  void Reap();
  // Sends `sig` to the process group of every rank still running.
  void Signal(int sig);
  // `sig` (SIGTERM, or the SIGINT neuronrun got) now, SIGKILL to the
  // survivors after `grace`.
  void Stop(std::chrono::milliseconds grace, int sig);
  // SIGKILL to every rank still running.
  void Kill();
  // Every rank has finished (exited and drained).
  bool Finished() const;
  std::size_t running() const;
  // The process group of every rank started (its pid).
  std::set<pid_t> process_groups() const;

 private:
  struct Rank;
  void StartReading(Rank& rank, bool is_stderr);
  void OnLine(Rank& rank, bool is_stderr, std::string_view line);
  // A shared zygote's rank: its wait status, read from `fd`.
  void AwaitStatus(Rank& rank, int fd);
  void Exited(Rank& rank, int wait_status);
  void MaybeFinish(Rank& rank);
  void DeliverExits();
  void FlushConsole();

  boost::asio::io_context& io_;
  ProcessGuard& guard_;
  OutputOptions output_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  ExitCallback on_exit_;
  Spawner spawn_;
  std::deque<Rank*> reaped_;  // exited, not yet delivered, in reap order
  boost::asio::steady_timer kill_timer_;
  std::string console_out_;  // pending whole lines for fd 1
  std::string console_err_;  // pending whole lines for fd 2
};

}  // namespace neuron::launcher
