#include "rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "neuron/runtime/error.h"
#include "ports.h"

namespace neuron::launcher {

using std::chrono::milliseconds;

Rendezvous::Rendezvous(std::shared_ptr<collectives::TcpStore> store,
                       RendezvousOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

std::string Rendezvous::Key(std::uint32_t round, const std::string& name) const {
  return options_.run_id + "/" + std::to_string(round) + "/" + name;
}

World Rendezvous::Join(std::uint32_t round) {
  const std::string me = std::to_string(options_.node_rank);
  if (store_->Add(Key(round, "claim/" + me), 1) != 1) {
    throw InvalidUsage(StrCat("another neuronrun agent already joined run '",
                              options_.run_id, "' as --node-rank ", me));
  }
  // If this agent dies from here on, the round fails for everyone.
  proto::JobFailure lost;
  lost.set_node_rank(options_.node_rank);
  lost.set_hostname(options_.hostname);
  lost.set_global_rank(-1);
  lost.set_local_rank(-1);
  lost.set_exit_code(1);
  lost.set_final(true);
  lost.set_description(StrCat("the neuronrun agent of node ", me, " (", options_.hostname,
                              ") was lost: killed, crashed or cut off"));
  store_->ClearOnClose();
  store_->SetOnClose(Key(round, "failed"), lost.SerializeAsString());
  store_->SetOnClose(Key(round, "end"), "failed");
  // Node 0's Leave waits for every agent to read the end, but not for one lost.
  store_->SetOnClose(Key(round, "left/" + me), "lost");

  proto::NodeInfo info;
  info.set_node_rank(options_.node_rank);
  info.set_nnodes(options_.nnodes);
  info.set_nproc(options_.nproc);
  info.set_hostname(options_.hostname);
  info.set_agent_pid(static_cast<int>(::getpid()));
  store_->Set(Key(round, "node/" + me), info.SerializeAsString());

  if (options_.node_rank == 0) {
    proto::MasterInfo master;
    master.set_addr(options_.master_addr);
    if (options_.master_port) {
      NEURON_CHECK(PortIsFree(*options_.master_port), "--master-port ",
                   *options_.master_port, " is already in use");
      master.set_port(*options_.master_port);
    } else {
      master.set_port(PickFreePort());
    }
    store_->Set(Key(round, "master"), master.SerializeAsString());
  }
  return Gather(round);
}

World Rendezvous::Gather(std::uint32_t round) {
  std::vector<std::string> keys;
  for (std::uint32_t n = 0; n < options_.nnodes; ++n) {
    keys.push_back(Key(round, "node/" + std::to_string(n)));
  }
  keys.push_back(Key(round, "master"));
  WaitOrRefused(round, keys);
  World world;
  for (std::uint32_t n = 0; n < options_.nnodes; ++n) {
    proto::NodeInfo info;
    NEURON_ASSERT(info.ParseFromString(store_->Get(keys[n])), "bad NodeInfo");
    if (info.nnodes() != options_.nnodes) {
      Refuse(round, StrCat("node ", n, " (", info.hostname(), ") was started with --nnodes ",
                           info.nnodes(), " but node ", options_.node_rank, " with --nnodes ",
                           options_.nnodes));
    }
    if (n == options_.node_rank) world.rank_offset = world.world_size;
    world.world_size += info.nproc();
    world.nproc_per_node.push_back(info.nproc());
    world.hostnames.push_back(info.hostname());
  }
  proto::MasterInfo master;
  NEURON_ASSERT(master.ParseFromString(store_->Get(keys.back())), "bad MasterInfo");
  world.master_addr = master.addr();
  world.master_port = static_cast<std::uint16_t>(master.port());
  return world;
}

// Waits for `keys` in slices, so that a refusal another agent published
// (Refuse) ends the wait with its reason instead of a lost store.
void Rendezvous::WaitOrRefused(std::uint32_t round, const std::vector<std::string>& keys) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  const std::string refused = Key(round, "refused");
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      store_->Wait(keys, std::clamp(left, std::chrono::milliseconds(1), kRefusalPoll));
      return;
    } catch (const TimeoutError& e) {
      if (store_->Check({refused})) {
        throw InvalidUsage(StrCat("rendezvous of run '", options_.run_id, "' ",
                                  store_->Get(refused, std::chrono::seconds(1))));
      }
      if (left <= kRefusalPoll) {
        throw TimeoutError(StrCat("rendezvous of run '", options_.run_id, "' timed out after ",
                                  options_.timeout.count() / 1000, " s waiting for ",
                                  options_.nnodes, " nodes: ", e.what()));
      }
    }
  }
}

void Rendezvous::Refuse(std::uint32_t round, const std::string& reason) {
  // "refused by node N: why", N the node that found it (any node may).
  store_->CompareSet(Key(round, "refused"), "",
                     StrCat("refused by node ", options_.node_rank, ": ", reason));
  // Node 0 hosts the store: it stays until the waiting agents had a slice
  // to read the reason.
  if (options_.node_rank == 0) std::this_thread::sleep_for(2 * kRefusalPoll);
  throw InvalidUsage(reason);
}

void Rendezvous::ReportFailure(std::uint32_t round, const proto::JobFailure& failure) {
  store_->CompareSet(Key(round, "failed"), "", failure.SerializeAsString());
  store_->Set(Key(round, "end"), "failed");
}

void Rendezvous::ReportSuccess(std::uint32_t round) {
  if (store_->Add(Key(round, "done"), 1) == static_cast<std::int64_t>(options_.nnodes)) {
    store_->CompareSet(Key(round, "end"), "", "ok");
  }
}

RoundEnd Rendezvous::AwaitEnd(std::uint32_t round, collectives::TcpStore& watch,
                              const std::atomic<bool>& stop) {
  const std::string end_key = Key(round, "end");
  RoundEnd end;
  while (!stop.load()) {
    try {
      // Short waits, so that a stop request is seen within a second.
      watch.Wait({end_key}, milliseconds(1000));
    } catch (const TimeoutError&) {
      continue;
    }
    if (watch.Get(end_key, milliseconds(1000)) == "ok") {
      end.kind = RoundEnd::kSucceeded;
      return end;
    }
    end.kind = RoundEnd::kFailed;
    NEURON_ASSERT(end.failure.ParseFromString(watch.Get(Key(round, "failed"))),
                  "bad JobFailure");
    return end;
  }
  return end;
}

void Rendezvous::Leave(std::uint32_t round) {
  if (options_.node_rank != 0) {
    try {
      store_->ClearOnClose();
      store_->Set(Key(round, "left/" + std::to_string(options_.node_rank)), "");
    } catch (const Error&) {
      // Node 0's server is gone: the job's end is already decided.
    }
    return;
  }
  store_->ClearOnClose();
  store_->Set(Key(round, "left/0"), "");
  std::vector<std::string> keys;
  for (std::uint32_t n = 0; n < options_.nnodes; ++n) {
    keys.push_back(Key(round, "left/" + std::to_string(n)));
  }
  try {
    store_->Wait(keys, options_.grace_period + std::chrono::seconds(10));
  } catch (const TimeoutError&) {
    // An agent that never reads the end has failed on its own; stop serving.
  }
}

}  // namespace neuron::launcher
