// A group of ranks that run collectives together, over a transport.
//
// Created collectively from a store, a rank and a size; every rank must call
// the same collectives in the same order with matching arguments. Each
// collective first shows every rank a small header (op, sequence number,
// count, dtype, reduce op, root), through the shared windows or around the
// ring over TCP: a rank that sees another rank's call differ raises
// InvalidUsage naming both calls, and aborts the group, so no rank hangs or
// reads mismatched data. Then the tuner (tuner.h) picks the algorithm, a
// free function over the group (collectives/src/algorithms.h) runs it, and
// one hook accounts it on the two clocks (collectives/src/op_accounting.h).
//
// Usage:
//   Communicator comm(store, rank, size);
//   comm.AllReduce({.data = grads, .count = n, .dtype = DataType::kFloat32});
//   comm.Broadcast({.data = params, .count = n, .dtype = DataType::kFloat32, .root = 0});
//
// Results are deterministic: the same inputs give bitwise the same output on
// every rank and every run, for every algorithm (each fixes its reduction
// order; the automatic choice depends only on size and rank count). The
// direct algorithm (the default on shared memory) reduces every element over
// the ranks in rank order, accumulating float16/bfloat16 in float32, so its
// result is also independent of the rank count's chunking and equals the
// naive reference bitwise; ring and recursive doubling fix other orders.
// Not thread-safe: one thread issues a communicator's collectives; Send and
// Recv (a channel of their own) may be issued by one other thread meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "neuron/collectives/dtype.h"
#include "neuron/collectives/group_context.h"
#include "neuron/collectives/op_stats.h"
#include "neuron/collectives/store/store.h"
#include "neuron/collectives/transport/transport.h"
#include "neuron/collectives/tuner.h"

namespace neuron::runtime {
class FabricModel;
class SimClock;
}  // namespace neuron::runtime

namespace neuron::collectives {

namespace transport {
class SharedWindows;
class PeerBufferMap;
}
using transport::Label;
namespace detail {  // private to the implementation (collectives/src)
enum class OpCode : std::uint8_t;
struct Header;
struct Agreed;
class Handshake;
class Hierarchy;
class OpAccounting;
}  // namespace detail

// Host algorithms; each names its source where it is implemented.
enum class TransportKind {
  kAuto,  // shared memory when every rank is on this host, else TCP
  kShm,
  kTcp,   // also on one host: tests, simulated nodes
};

struct CommunicatorOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  TransportKind transport = TransportKind::kAuto;
  // Allreduce at or below this size reduces the whole buffer on every rank
  // in one phase (direct); above it, each rank reduces a slice.
  std::size_t small_message_bytes = 16u << 10;
  std::size_t shm_ring_bytes = 512u << 10;  // per pair, allocated up front
  // Shared-memory window per rank for the direct algorithms (0: automatic,
  // 8 MiB shared by the ranks, 64 KiB to 1 MiB each: rounds whose windows
  // all stay in the last-level cache are the fastest).
  std::size_t shm_window_bytes = 0;
  // TCP: the address this rank listens on; empty: its host name's address
  // (127.0.0.1 when every rank is on this host).
  std::string tcp_address;
  // TCP: the job's secret when the store is not authenticated (torchrun's
  // TCPStore): connection tokens are derived from it, not kept in the store
  // (transport::TcpOptions::secret). Empty: a random token in the store.
  std::string transport_secret;
  // Which host this rank is on, for locality: ranks with equal hosts share
  // memory. Empty: this machine (host name and boot id), plus the simulated
  // node when NEURON_NODE_INDEX is set, so neuronrun's nodes on one machine
  // count as hosts. Tests set it to simulate several hosts.
  std::string host;

  // Simulated time. `clock` is this rank's (shared by all its communicators;
  // default: one of its own). `fabric` models the job's fabric (default: the
  // topology of NEURON_TOPOLOGY_FILE or the embedded trn2 node, with the
  // ranks placed as neuronrun places them). `global_ranks[i]` is the job rank
  // of member i (default: i), which says where it sits on the fabric.
  std::shared_ptr<runtime::SimClock> clock;
  std::shared_ptr<const runtime::FabricModel> fabric;
  std::vector<int> global_ranks;
  // Per-operation records kept (the oldest are dropped beyond this).
  std::size_t max_records = 4096;
};

struct AllReduceOptions {
  void* data = nullptr;  // in place
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;  // kAuto: NEURON_CC_ALGO, else the tuner
};

struct BroadcastOptions {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int root = 0;
};

struct AllGatherOptions {
  const void* input = nullptr;  // count elements
  void* output = nullptr;       // size x count elements, rank order
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  // kAuto: hierarchical across hosts, else Bruck up to 4 KiB a block, ring above.
  Algorithm algorithm = Algorithm::kAuto;
};

struct ReduceScatterOptions {
  const void* input = nullptr;  // size x count elements (or sum(counts))
  void* output = nullptr;       // count (or counts[rank]) elements: this rank's block
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  // Uneven blocks: counts[r] elements for rank r, packed in rank order (every
  // rank passes the same counts). Empty: equal blocks of `count`.
  std::vector<std::size_t> counts{};
};

struct ReduceOptions {
  void* data = nullptr;  // every rank's input; the result replaces it on root
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
};

struct GatherOptions {
  const void* input = nullptr;  // count elements
  void* output = nullptr;       // root: size x count elements, rank order
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int root = 0;
};

struct ScatterOptions {
  const void* input = nullptr;  // root: size x count elements, rank order
  void* output = nullptr;       // count elements
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int root = 0;
};

// All-to-all: block p of the input goes to rank p; block p of the output
// comes from rank p. Equal blocks of `count` elements when the count vectors
// are empty; otherwise send_counts[p] / recv_counts[p] elements (blocks
// packed in rank order), and what rank a sends to b must equal what b
// expects from a (checked on the wire).
struct AllToAllOptions {
  const void* input = nullptr;
  void* output = nullptr;
  std::size_t count = 0;
  std::vector<std::size_t> send_counts{};
  std::vector<std::size_t> recv_counts{};
  DataType dtype = DataType::kFloat32;
};

// Allgather with a block of counts[r] elements from rank r (every rank
// passes the same counts); output is the blocks packed in rank order.
struct AllGatherVOptions {
  const void* input = nullptr;  // counts[rank] elements
  void* output = nullptr;       // sum(counts) elements
  std::vector<std::size_t> counts{};
  DataType dtype = DataType::kFloat32;
};

class Communicator : private GroupContext {
 public:
  // Collective: every rank of the group calls it with the same store.
  Communicator(std::shared_ptr<Store> store, int rank, int size,
               CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  using GroupContext::rank;
  using GroupContext::size;
  // The timeout of the collectives run from now on (group_context.h).
  using GroupContext::set_operation_timeout;
  // "shm" or "tcp".
  const char* transport_name() const { return transport_->name(); }
  // Whether the ranks span hosts with several ranks on some host, so
  // allreduce runs hierarchically by default (Algorithm::kHierarchical).
  bool hierarchical() const { return hierarchy_ != nullptr; }
  // Collectives issued so far (the next one gets this number).
  std::uint64_t sequence() const;

  void AllReduce(const AllReduceOptions& options);
  void Broadcast(const BroadcastOptions& options);
  void AllGather(const AllGatherOptions& options);
  void ReduceScatter(const ReduceScatterOptions& options);
  void Barrier();
  void Reduce(const ReduceOptions& options);
  void Gather(const GatherOptions& options);
  void Scatter(const ScatterOptions& options);
  void AllToAll(const AllToAllOptions& options);
  void AllGatherV(const AllGatherVOptions& options);

  // Every rank's pending and future operations fail with `reason`.
  void Abort(const std::string& reason);

  // Point-to-point, on a channel of its own (never interleaved with the
  // collectives' streams). Messages from one peer with one tag arrive in the
  // order they were sent; messages with other tags wait until received. A
  // receive must ask for exactly the size of the message (InvalidUsage
  // naming both sizes otherwise). By default Send returns once its bytes
  // left (as MPI_Send: at once for messages that fit the transport's
  // buffers, when the receiver takes them otherwise). With buffered sends
  // (set_buffered_sends(true); AsyncCommunicator turns it on) Send copies
  // the message, hands it to the transport and returns (as MPI_Bsend); the
  // bytes leave during later waits on the channel (any Recv, or
  // ProgressSends, which AsyncCommunicator calls while its point-to-point
  // lane is idle), so ranks may send each other large messages before
  // receiving. Beyond kMaxBufferedBytes of copies, Send waits for the
  // oldest. An error met in the background fails every later Send and
  // Recv. In simulated time a receive completes at max(posted, sent +
  // modelled transfer).
  static constexpr std::size_t kMaxBufferedBytes = std::size_t{256} << 20;
  static constexpr int kAnySource = -1;
  void Send(int peer, const void* data, std::size_t bytes, std::uint64_t tag = 0);
  // Returns the rank the message came from (useful with kAnySource).
  int Recv(int peer, void* data, std::size_t bytes, std::uint64_t tag = 0);
  // Moves buffered sends' bytes for at most `at_most`; true while some are
  // still in flight (false once all left, or after an error, kept for the
  // next Send or Recv). Same thread as Send and Recv.
  bool ProgressSends(std::chrono::milliseconds at_most);
  // The timeout of the messages (Send, Recv, ProgressSends' waits) run from
  // now on, until set again; zero or less: CommunicatorOptions::timeout.
  // The messages' thread sets it; the collectives' is
  // set_operation_timeout (group_context.h).
  void set_message_timeout(std::chrono::milliseconds timeout) { message_timeout_ = timeout; }

  // Collective over this communicator (as MPI_Comm_split): ranks passing the
  // same `color` form a new communicator, ordered by (key, rank); a rank
  // passing kNoColor joins none and gets null. The new communicator shares
  // this one's clock (unless options.clock is set) and fabric model, and its
  // members keep their places on the fabric. `options` apply to the new one
  // (fabric and global ranks ignored; an empty transport_secret is this
  // one's).
  static constexpr int kNoColor = -1;
  std::unique_ptr<Communicator> Split(int color, int key, CommunicatorOptions options = {});

  // Two-clock accounting of every completed operation.
  // The latest records, oldest first (at most max_records).
  const RecordLog& records() const;
  CommunicatorTotals totals() const;
  void ResetStats();
  // Writes the records as a Chrome trace (chrome://tracing, Perfetto): one
  // track on the wall clock, one on the simulated clock.
  void WriteChromeTrace(const std::string& path) const;
  runtime::SimClock& clock();
  // Whether a completed operation also advances this rank's compute clock
  // to its end (true: the caller waited for it, as a synchronous call does).
  // AsyncCommunicator turns it off and joins when the work is waited on.
  void set_join_compute(bool join);
  // See Send. Set before the first Send.
  void set_buffered_sends(bool buffered) { buffered_sends_ = buffered; }
  const runtime::FabricModel& fabric() const;

 private:
  class OpScope;        // communicator_internal.h
  struct PointToPoint;  // point_to_point.cc
  // The collectives' transport, over shared memory when every rank is on
  // this host (unless TCP was asked for), and the hierarchy across hosts.
  void Connect(const CommunicatorOptions& options);
  void StartPointToPoint(bool one_host, const CommunicatorOptions& options);
  void AbortPointToPoint(const std::string& reason);
  // Drops buffered sends that completed, making progress until `until`.
  void ReapSends(std::chrono::steady_clock::time_point until);
  // A deadline for a message's next wait (set_message_timeout).
  transport::Deadline MessageDeadline() const {
    return transport::Deadline::After(message_timeout_.count() > 0 ? message_timeout_
                                                                   : timeout_);
  }
  GroupShape shape() const { return {size_, windows_ != nullptr, hierarchy_ != nullptr}; }
  // The header of the next collective, and its handshake (handshake.h)
  // at this rank's arrival (op_accounting.h).
  detail::Header NewHeader(detail::OpCode op, DataType dtype, std::uint64_t count,
                           ReduceOp reduce = ReduceOp::kSum, int root = -1) const;
  detail::Agreed Handshake(detail::Header& mine, const void* staged = nullptr,
                           std::size_t staged_bytes = 0, const void* slot_data = nullptr,
                           std::size_t slot_bytes = 0);
  void CheckRoot(int root, const char* op) const;
  // Runs the allreduce `algorithm` chose after the handshake of `h`.
  void RunAllReduce(Algorithm algorithm, const detail::Header& h, char* data,
                    bool staged_with_handshake);
  // The direct allreduces after the handshake: from where it put every
  // rank's data (`path`: a Header::path), or on the registered buffers when
  // every rank's is (returns false otherwise, and sets *none_registered).
  void SmallDirectAllReduce(char* data, std::size_t count, DataType dtype, ReduceOp op,
                            std::uint8_t path);
  bool TryRegisteredAllReduce(char* data, std::size_t count, DataType dtype, ReduceOp op,
                              const Label& what, bool* none_registered);
  // Gather (op kGather) or Scatter (kScatter).
  void Linear(detail::OpCode op, const void* input, void* output, std::size_t count,
              DataType dtype, int root);

  std::shared_ptr<Store> store_;
  std::unique_ptr<detail::OpAccounting> accounting_;  // the hook around each operation
  std::unique_ptr<detail::Handshake> handshake_;      // the call check before each
  Tuner tuner_;
  std::unique_ptr<detail::Hierarchy> hierarchy_;  // across hosts, several ranks on some
  std::unique_ptr<PointToPoint> p2p_;
  // Peers' registered buffers mapped here (RegisteredAllReduce).
  std::unique_ptr<transport::PeerBufferMap> peer_buffers_;
  std::vector<const void*> window_inputs_;  // SmallDirectAllReduce's, reused
  std::chrono::milliseconds message_timeout_{0};
  std::string transport_secret_;  // CommunicatorOptions::transport_secret, for Split
  bool registered_op_ = false;  // the running operation used them (its OpRecord says)
  bool buffered_sends_ = false;
};

}  // namespace neuron::collectives
