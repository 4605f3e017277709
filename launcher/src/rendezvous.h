// How the neuronrun agents of one job agree on the world, round by round
// (a round is one attempt: restarts start a new round).
//
// Keys, all under "<run_id>/<round>/" in the store served by node 0's agent:
//   claim/<node>  counter; a second agent with the same --node-rank fails
//   node/<node>   NodeInfo of that node's agent
//   master        MasterInfo: MASTER_ADDR and MASTER_PORT, chosen by node 0
//   failed        JobFailure: the round's first failure (first writer wins)
//   done          counter of nodes whose ranks all succeeded
//   end           "ok" or "failed": the round is over for every agent
//   left/<node>   the agent has read the end (node 0 waits before exiting)
// An agent whose connection drops (killed, crashed) fails the round through
// the store's set-on-close actions.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "neuron/collectives/store/tcp_store.h"
#include "neuron/launcher/rendezvous.pb.h"

namespace neuron::launcher {

struct RendezvousOptions {
  std::string run_id;
  std::uint32_t node_rank = 0;
  std::uint32_t nnodes = 1;
  std::uint32_t nproc = 1;
  std::string hostname;
  std::string master_addr;                   // what node 0 advertises
  std::optional<std::uint16_t> master_port;  // node 0: fixed port, else free
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long another node may take to stop its ranks (--grace-period):
  // node 0 serves that much longer, for their Leave.
  std::chrono::milliseconds grace_period{5000};
};

struct World {
  std::uint32_t world_size = 0;
  std::uint32_t rank_offset = 0;  // global rank of this node's local rank 0
  std::vector<std::uint32_t> nproc_per_node;
  std::vector<std::string> hostnames;
  std::string master_addr;
  std::uint16_t master_port = 0;
};

struct RoundEnd {
  enum Kind { kStopped, kSucceeded, kFailed };
  Kind kind = kStopped;
  proto::JobFailure failure;  // when kFailed: the round's first failure
};

class Rendezvous {
 public:
  // `store` is this agent's connection to node 0's store server.
  Rendezvous(std::shared_ptr<collectives::TcpStore> store, RendezvousOptions options);

  // Registers for `round`, waits for every node (TimeoutError naming the
  // missing nodes), and returns the agreed world.
  World Join(std::uint32_t round);
  // Records `failure` unless another failure came first, and ends the round.
  void ReportFailure(std::uint32_t round, const proto::JobFailure& failure);
  // This node's ranks all succeeded; the last node to succeed ends the round.
  void ReportSuccess(std::uint32_t round);
  // Blocks (on `watch`, a second connection) until the round ends or `stop`
  // becomes true (seen within a second). Throws IoError when the store
  // server is lost.
  RoundEnd AwaitEnd(std::uint32_t round, collectives::TcpStore& watch,
                    const std::atomic<bool>& stop);
  // Done with the job: clears this agent's set-on-close actions; node 0
  // waits for every agent to leave (up to the grace period and 10 s) before
  // its server goes away; an agent whose connection closed (lost, killed,
  // cut off) counts as left. Best effort on the other nodes: a store already
  // gone has nothing left to be told, and is not an error.
  void Leave(std::uint32_t round);

 private:
  std::string Key(std::uint32_t round, const std::string& name) const;
  World Gather(std::uint32_t round);
  // Rendezvous::Gather's wait, ended early by a refusal (InvalidUsage).
  void WaitOrRefused(std::uint32_t round, const std::vector<std::string>& keys);
  // Publishes why the rendezvous cannot go on, then throws it.
  [[noreturn]] void Refuse(std::uint32_t round, const std::string& reason);
  static constexpr std::chrono::milliseconds kRefusalPoll{500};

  std::shared_ptr<collectives::TcpStore> store_;
  RendezvousOptions options_;
};

}  // namespace neuron::launcher
