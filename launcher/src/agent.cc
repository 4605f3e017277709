#include "agent.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <set>
#include <thread>
#include <utility>

#include "exit_status.h"
#include "failure_report.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "rank_env.h"
#include "restart_delay.h"
#include "strays.h"

namespace neuron::launcher {

namespace asio = boost::asio;

// The state of one attempt, touched only on the event-loop thread (the
// watcher thread only posts to it).
struct Agent::Attempt {
  std::uint32_t round = 0;
  std::unique_ptr<RankGroup> group;
  std::optional<proto::JobFailure> local_failure;
  std::optional<RoundEnd> end;
  int interrupt_signal = 0;
  int signal_while_stopping = 0;  // SIGINT/SIGTERM after a failure
  bool stopping = false;
  bool success_reported = false;
  bool done = false;
  std::atomic<bool> stop_watch{false};
  std::thread watcher;

  // Whatever ends the attempt, even an exception, the watcher goes too.
  ~Attempt() {
    stop_watch = true;
    if (watcher.joinable()) watcher.join();
  }
};

Agent::Agent(JobConfig config)
    : config_(std::move(config)) {
  const auto& o = config_.options;
  const bool multi_node = o.nnodes > 1;
  const std::string connect_host = multi_node ? o.rdzv_host : "127.0.0.1";
  std::uint16_t port = o.rdzv_port;
  if (o.node_rank == 0) {
    collectives::TcpStoreServerOptions server_options;
    server_options.host = config_.bind_address;
    server_options.port = multi_node ? o.rdzv_port : 0;
    server_options.secret = config_.secret;
    server_options.log = [](const std::string& line) {
      std::cerr << "neuronrun: " << line << std::endl;
    };
    server_ = std::make_unique<collectives::TcpStoreServer>(std::move(server_options));
    port = server_->port();
  }
  collectives::TcpStoreOptions client;
  client.host = connect_host;
  client.port = port;
  client.secret = config_.secret;
  client.connect_timeout = o.rdzv_timeout;
  store_endpoint_ = connect_host + ":" + std::to_string(port);
  try {
    store_ = std::make_shared<collectives::TcpStore>(client);
    watch_store_ = std::make_unique<collectives::TcpStore>(client);
  } catch (const TimeoutError& e) {
    throw TimeoutError(StrCat("rendezvous endpoint ", store_endpoint_,
                              " did not answer within ", o.rdzv_timeout.count(),
                              " s; is node 0's neuronrun running there?"));
  }
  AgreeOnRunId();

  RendezvousOptions r;
  r.run_id = config_.run_id;  // as agreed above
  r.node_rank = o.node_rank;
  r.nnodes = o.nnodes;
  r.nproc = o.nproc_per_node;
  r.hostname = config_.hostname;
  r.master_addr = multi_node ? o.rdzv_host : "127.0.0.1";
  r.master_port = o.master_port;
  r.timeout = o.rdzv_timeout;
  r.grace_period = o.grace_period;
  rendezvous_ = std::make_unique<Rendezvous>(store_, r);
}

Agent::~Agent() = default;

void Agent::AgreeOnRunId() {
  // Node 0's id (given or random) is the job's; the others adopt it, and a
  // different --run-id on another node is an error.
  const std::string key = "job/run_id";
  if (config_.options.node_rank == 0) {
    store_->Set(key, config_.run_id);
    return;
  }
  const std::string job_id = store_->Get(key, config_.options.rdzv_timeout);
  NEURON_CHECK(config_.options.run_id.empty() || config_.options.run_id == job_id,
               "--run-id ", config_.options.run_id, " differs from node 0's run id ",
               job_id);
  config_.run_id = job_id;
}

int Agent::Run() {
  const auto& o = config_.options;
  for (std::uint32_t round = 0;; ++round) {
    const World world = rendezvous_->Join(round);
    std::vector<std::uint32_t> per_node(world.nproc_per_node.begin(),
                                        world.nproc_per_node.end());
    config_.topology.CheckFits(o.nnodes, per_node);
    runtime::CheckRoutes(runtime::Topology::WithEnvironmentFaults(config_.topology), o.nnodes,
                         per_node);
    Attempt attempt;
    attempt.round = round;
    Result result;
    try {
      result = RunAttempt(round, world, attempt);
    } catch (...) {
      EndAttempt(attempt);
      throw;
    }
    if (result == Result::kSucceeded) {
      rendezvous_->Leave(round);
      return 0;
    }
    if (result == Result::kInterrupted) {
      std::cerr << "neuronrun: interrupted by " << SignalName(attempt.interrupt_signal)
                << "; stopped every rank" << std::endl;
      rendezvous_->Leave(round);
      return 128 + attempt.interrupt_signal;
    }
    const proto::JobFailure& failure =
        attempt.local_failure ? *attempt.local_failure : attempt.end->failure;
    std::cerr << FormatFailure(failure);
    if (attempt.signal_while_stopping != 0) {
      std::cerr << "neuronrun: " << SignalName(attempt.signal_while_stopping)
                << " while stopping: the ranks killed, no restart" << std::endl;
    } else if (round < o.max_restarts && !failure.final()) {
      // Every agent saw the same failed round, so each waits the same time.
      const std::chrono::milliseconds delay = RestartDelay(round + 1);
      std::cerr << "neuronrun: restarting the job (restart " << round + 1 << " of "
                << o.max_restarts << ") in " << delay.count() / 1000.0 << " s" << std::endl;
      std::this_thread::sleep_for(delay);
      continue;
    }
    std::cerr << "neuronrun: stopped every rank; the job failed after " << round + 1
              << (round == 0 ? " attempt" : " attempts") << std::endl;
    rendezvous_->Leave(round);
    return failure.exit_code() == 0 ? 1 : failure.exit_code();
  }
}

int Agent::CpuFor(std::uint32_t local) const {
  const std::string& bind = config_.options.bind_to;
  if (bind == "none") return -1;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.empty()) return -1;
  // auto: as Open MPI, pin only when every rank can have a CPU of its own.
  if (bind == "auto" && config_.options.nproc_per_node > cpus.size()) return -1;
  return cpus[local % cpus.size()];
}

std::vector<RankLaunch> Agent::MakeLaunches(std::uint32_t round,
                                            const World& world) const {
  const auto& o = config_.options;
  const Environment base = CurrentEnvironment();
  std::vector<RankLaunch> launches;
  for (std::uint32_t local = 0; local < o.nproc_per_node; ++local) {
    RankIdentity id;
    id.global_rank = world.rank_offset + local;
    id.local_rank = local;
    id.world_size = world.world_size;
    id.local_world_size = o.nproc_per_node;
    id.node_rank = o.node_rank;
    id.nnodes = o.nnodes;
    id.restart_count = round;
    id.max_restarts = o.max_restarts;
    id.run_id = config_.run_id;
    id.master_addr = world.master_addr;
    id.master_port = world.master_port;
    id.placement = config_.topology.Place(o.node_rank, local);
    id.ranks_per_chip = config_.topology.spec().ranks_per_chip();
    id.topology_file = config_.topology_file;
    id.device_file = config_.device_file;
    id.store_endpoint = store_endpoint_;
    id.job_secret = config_.secret;
    id.agent_id = guard_.agent_id();
    id.python_path = config_.python_path;
    RankLaunch launch;
    launch.global_rank = id.global_rank;
    launch.local_rank = local;
    launch.spawn.path = config_.program_path;
    launch.spawn.argv = config_.program_argv;
    launch.spawn.env = ToEnvp(RankEnvironment(base, id));
    launch.spawn.cpu = CpuFor(local);
    launches.push_back(std::move(launch));
  }
  return launches;
}

namespace {

// A rank's environment without the variables that are its own (RANK,
// LOCAL_RANK, chip, core): the job's and the node's.
std::vector<std::string> JobEnvironment(const RankLaunch& launch) {
  std::vector<std::string> job;
  for (const std::string& entry : launch.spawn.env) {
    if (!IsRankOwnVariable(entry.substr(0, entry.find('=')))) job.push_back(entry);
  }
  return job;
}

}  // namespace

RankGroup::Spawner Agent::RankSpawner(const std::vector<RankLaunch>& launches) {
  if (config_.preload.empty() || launches.empty()) return launcher::Spawn;
  if (!zygote_ && !zygote_failed_) {
    try {
      zygote_ = SharedZygote(launches.front());
      if (!zygote_) {
        zygote_ = std::make_unique<Zygote>(config_.program_path, JobEnvironment(launches.front()),
                                           config_.preload);
      }
    } catch (const Error& e) {
      DropZygote(e);
    }
  }
  if (!zygote_) return launcher::Spawn;
  // A zygote that fails later (it died, it did not answer) is dropped: this
  // rank and the next start as fresh interpreters.
  return [this](const SpawnRequest& r) {
    if (zygote_) {
      try {
        return zygote_->Spawn(r);
      } catch (const Error& e) {
        DropZygote(e);
      }
    }
    return launcher::Spawn(r);
  };
}

std::unique_ptr<Zygote> Agent::SharedZygote(const RankLaunch& first) {
  std::unique_ptr<Zygote> shared;
  try {
    if (config_.zygote_fd >= 0) {
      shared = std::make_unique<Zygote>(std::exchange(config_.zygote_fd, -1));
    } else if (!config_.zygote_socket.empty()) {
      shared = Zygote::ConnectTo(config_.zygote_socket);
    }
  } catch (const Error& e) {
    std::cerr << "neuronrun: " << e.what() << "; the ranks fork from a zygote of this job's own"
              << std::endl;
    return nullptr;
  }
  // One imported with other settings would leave them in every rank.
  if (shared && !shared->Refusal(config_.preload, first.spawn.env).empty()) shared.reset();
  return shared;
}

void Agent::DropZygote(const Error& why) {
  zygote_.reset();
  zygote_failed_ = true;
  std::cerr << "neuronrun: " << why.what() << "; the ranks start as fresh interpreters"
            << std::endl;
}

void Agent::EndAttempt(Attempt& attempt) {
  std::set<pid_t> groups;
  if (attempt.group != nullptr) groups = attempt.group->process_groups();
  if (zygote_ && zygote_->pid() > 0) groups.insert(zygote_->pid());  // kept for the restarts
  attempt.group.reset();  // kills what is left of every rank's group
  for (const Stray& s : KillStrayDescendants(guard_.watchdog(), groups)) {
    std::cerr << "neuronrun: killed pid " << s.pid << " (" << s.name
              << "), left running by the ranks outside their process groups" << std::endl;
  }
}

Agent::Result Agent::RunAttempt(std::uint32_t round, const World& world,
                                Attempt& attempt) {
  const auto& o = config_.options;
  OutputOptions output;
  output.console = o.log_dir.empty() || o.tee;
  if (!o.log_dir.empty()) output.log_dir = o.log_dir + "/attempt_" + std::to_string(round);
  std::vector<RankLaunch> launches = MakeLaunches(round, world);
  RankGroup::Spawner spawn = RankSpawner(launches);
  attempt.group = std::make_unique<RankGroup>(
      io_, guard_, output, std::move(launches),
      [this, &attempt](const RankExit& exit) { OnRankExit(attempt, exit); }, std::move(spawn));

  attempt.watcher = std::thread([this, &attempt, round] {
    RoundEnd end;
    try {
      end = rendezvous_->AwaitEnd(round, *watch_store_, attempt.stop_watch);
    } catch (const Error& e) {
      end.kind = RoundEnd::kFailed;
      end.failure.set_global_rank(-1);
      end.failure.set_exit_code(1);
      end.failure.set_final(true);
      end.failure.set_description(StrCat("lost contact with the job's store on node 0 (",
                                         store_endpoint_, "): ", e.what()));
    }
    if (end.kind == RoundEnd::kStopped) return;
    asio::post(io_, [this, &attempt, end] { OnRoundEnd(attempt, end); });
  });

  signals_ = std::make_unique<asio::signal_set>(io_, SIGCHLD, SIGINT, SIGTERM);
  WaitSignals(attempt);
  try {
    attempt.group->Start();
  } catch (const std::exception& e) {
    attempt.group->Kill();  // the ranks started before the failure
    std::cerr << "neuronrun: " << e.what() << std::endl;
    proto::JobFailure failure;
    failure.set_node_rank(o.node_rank);
    failure.set_global_rank(-1);
    failure.set_exit_code(1);
    failure.set_final(true);
    failure.set_description(e.what());
    attempt.local_failure = failure;
    attempt.stopping = true;
    ReportFailure(round, failure);
  }
  io_.restart();
  while (!attempt.done) {
    if (io_.run_one() == 0) break;
  }
  attempt.stop_watch = true;
  attempt.watcher.join();
  signals_->cancel();
  io_.restart();
  io_.poll();  // let the cancelled signal wait and leftover timers finish
  EndAttempt(attempt);
  signals_.reset();  // back to the default actions

  if (attempt.interrupt_signal != 0) return Result::kInterrupted;
  if (!attempt.local_failure && attempt.end && attempt.end->kind == RoundEnd::kSucceeded) {
    return Result::kSucceeded;
  }
  return Result::kFailed;
}

void Agent::WaitSignals(Attempt& attempt) {
  signals_->async_wait([this, &attempt](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    OnSignal(attempt, sig);
    WaitSignals(attempt);
  });
}

void Agent::OnSignal(Attempt& attempt, int sig) {
  if (sig == SIGCHLD) {
    attempt.group->Reap();
    return;
  }
  if (attempt.interrupt_signal != 0) {
    if (sig == SIGINT) attempt.group->Kill();  // a second Ctrl-C: at once
    return;
  }
  if (attempt.stopping) {
    // Already stopping for a rank's failure, which stays what is reported:
    // the signal ends the grace period, and the job is not restarted.
    attempt.signal_while_stopping = sig;
    attempt.group->Kill();
    return;
  }
  attempt.interrupt_signal = sig;
  attempt.stopping = true;
  attempt.group->Stop(config_.options.grace_period, sig);
  proto::JobFailure failure;
  failure.set_node_rank(config_.options.node_rank);
  failure.set_hostname(config_.hostname);
  failure.set_global_rank(-1);
  failure.set_exit_code(128 + sig);
  failure.set_final(true);
  failure.set_description(StrCat("neuronrun on node ", config_.options.node_rank, " (",
                                 config_.hostname, ") was stopped by ",
                                 SignalName(sig)));
  ReportFailure(attempt.round, failure);
}

void Agent::OnRankExit(Attempt& attempt, const RankExit& exit) {
  if (!Succeeded(exit.wait_status) && !attempt.stopping) {
    attempt.local_failure =
        FailureOfRank(exit, config_.options.node_rank, config_.hostname);
    attempt.stopping = true;
    attempt.group->Stop(config_.options.grace_period, SIGTERM);
    ReportFailure(attempt.round, *attempt.local_failure);
  }
  MaybeReportSuccess(attempt);
}

void Agent::OnRoundEnd(Attempt& attempt, const RoundEnd& end) {
  attempt.end = end;
  if (end.kind == RoundEnd::kFailed && !attempt.stopping) {
    attempt.stopping = true;
    attempt.group->Stop(config_.options.grace_period, SIGTERM);
  }
  MaybeReportSuccess(attempt);
}

void Agent::MaybeReportSuccess(Attempt& attempt) {
  if (!attempt.group->Finished()) return;
  if (!attempt.stopping && !attempt.success_reported) {
    attempt.success_reported = true;
    try {
      rendezvous_->ReportSuccess(attempt.round);
    } catch (const std::exception& e) {
      // The store is gone (node 0 lost): the watcher reports that as the end.
      std::cerr << "neuronrun: cannot report success to the job's store: " << e.what()
                << std::endl;
    }
  }
  if (attempt.end) attempt.done = true;
}

void Agent::ReportFailure(std::uint32_t round, const proto::JobFailure& failure) {
  try {
    rendezvous_->ReportFailure(round, failure);
  } catch (const std::exception& e) {
    // The store is gone (node 0 lost): this node still ends its own ranks,
    // and the watcher turns the lost store into the round's end.
    std::cerr << "neuronrun: cannot report the failure to the job's store: " << e.what()
              << std::endl;
  }
}

}  // namespace neuron::launcher
