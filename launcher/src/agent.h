// One neuronrun agent: the process that starts and watches the ranks of one
// node. Node 0's agent also serves the job's store (rendezvous and
// bootstrap). Every agent runs attempts (rounds): rendezvous, start the
// local ranks, wait for the round to end everywhere, and restart the whole
// job after a failure while --max-restarts allows.
//
// Threads: the caller's thread runs the Boost.Asio event loop (child pipes,
// SIGCHLD/SIGINT/SIGTERM, timers) and forks the ranks; one watcher thread per
// round blocks on the store until the round ends; node 0's store server has
// its own thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio.hpp>

#include "neuron/collectives/store/tcp_store.h"
#include "neuron/collectives/store/tcp_store_server.h"
#include "neuron/launcher/options.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/topology.h"
#include "process_guard.h"
#include "rank_group.h"
#include "rendezvous.h"
#include "zygote.h"

namespace neuron::launcher {

// What main resolves before the agent starts (all checked, paths absolute).
struct JobConfig {
  JobConfig(LaunchOptions o, runtime::Topology t)
      : options(std::move(o)), topology(std::move(t)) {}

  LaunchOptions options;
  runtime::Topology topology;
  std::string run_id;
  std::string secret;
  std::string hostname;
  std::string bind_address;    // node 0: where the store server listens
  std::string program_path;    // what to execve
  std::vector<std::string> program_argv;
  std::string topology_file;   // absolute, or empty for the embedded default
  std::string device_file;     // absolute, or empty: the inherited environment's
  std::string python_path;     // prepended to the ranks' PYTHONPATH
  std::vector<std::string> preload;  // Python ranks fork from a zygote importing these
  // A shared zygote for the preload (zygote.h): this connection
  // (NEURON_ZYGOTE_FD, given by `neuronrun matrix`) if >= 0, else the
  // socket (NEURON_ZYGOTE) if not empty.
  int zygote_fd = -1;
  std::string zygote_socket;
};

class Agent {
 public:
  // Starts node 0's store server and connects to the job's store. Throws
  // IoError/TimeoutError/InvalidUsage when the job cannot start.
  explicit Agent(JobConfig config);
  ~Agent();

  // Runs attempts until success, a final failure or an interrupt; returns
  // neuronrun's exit status.
  int Run();

 private:
  struct Attempt;
  enum class Result { kSucceeded, kFailed, kInterrupted };

  void AgreeOnRunId();
  Result RunAttempt(std::uint32_t round, const World& world, Attempt& attempt);
  // Ends the attempt's ranks, then kills (and names) the processes they
  // left outside their process groups (strays.h).
  void EndAttempt(Attempt& attempt);
  std::vector<RankLaunch> MakeLaunches(std::uint32_t round, const World& world) const;
  // How this attempt's ranks start: forked by the zygote (--preload; made
  // at the first attempt with the first launch's environment less the
  // rank's own variables, kept for the restarts; or the shared zygote of
  // zygote_fd or zygote_socket), else launcher::Spawn
  // (also once the zygote failed, at its start or later: said on stderr).
  RankGroup::Spawner RankSpawner(const std::vector<RankLaunch>& launches);
  void DropZygote(const Error& why);  // ends it, says why on stderr
  // The shared zygote if it serves this job (its preload and `first`'s
  // environment), else nullptr: the job starts a zygote of its own.
  std::unique_ptr<Zygote> SharedZygote(const RankLaunch& first);
  // The CPU local rank `local` is pinned to (--bind-to), or -1.
  int CpuFor(std::uint32_t local) const;
  void WaitSignals(Attempt& attempt);
  void OnSignal(Attempt& attempt, int sig);
  void OnRankExit(Attempt& attempt, const RankExit& exit);
  void OnRoundEnd(Attempt& attempt, const RoundEnd& end);
  void MaybeReportSuccess(Attempt& attempt);
  // Tells the other nodes; a lost store is reported, not thrown.
  void ReportFailure(std::uint32_t round, const proto::JobFailure& failure);

  JobConfig config_;
  ProcessGuard guard_;  // first: forked before any thread exists
  boost::asio::io_context io_;
  // SIGCHLD/SIGINT/SIGTERM are caught only while ranks run; before that
  // (rendezvous) they keep their default actions, so Ctrl-C still works.
  std::unique_ptr<boost::asio::signal_set> signals_;
  std::unique_ptr<collectives::TcpStoreServer> server_;
  std::shared_ptr<collectives::TcpStore> store_;
  std::unique_ptr<collectives::TcpStore> watch_store_;
  std::unique_ptr<Rendezvous> rendezvous_;
  std::string store_endpoint_;
  std::unique_ptr<Zygote> zygote_;
  bool zygote_failed_ = false;
};

}  // namespace neuron::launcher
