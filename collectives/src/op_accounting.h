// The one hook around each operation of a communicator: the two clocks
// (docs/architecture.md), the records and totals, and the operation trace.
//
// A collective arrives at Arrival() (the compute stream when it was issued,
// no earlier than the end of the communicator's previous collective, plus
// this rank's straggler delay), starts at the latest arrival over the ranks
// (the handshake agrees on it) and lasts what the fabric model says for its
// op and size; Record then advances the rank's clocks, appends an OpRecord
// and fills the running issue's trace entry. A message (Send/Recv) is
// traced with TraceMessage and completes at FinishReceive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "neuron/collectives/op_stats.h"
#include "neuron/runtime/fabric/collective_names.h"

namespace neuron::runtime {
class FabricModel;
class OpTrace;
class SimClock;
}  // namespace neuron::runtime

namespace neuron::collectives::detail {

struct Agreed;  // wire.h
struct Header;

// What accounting takes of a communicator's options (CommunicatorOptions'
// fields of the same names): null clock or fabric, or no global ranks,
// make the defaults.
struct AccountingOptions {
  std::shared_ptr<runtime::SimClock> clock;
  std::shared_ptr<const runtime::FabricModel> fabric;
  std::vector<int> global_ranks;
  std::size_t max_records = 4096;
};

class OpAccounting {
 public:
  // Takes the options' clock, fabric and global ranks (or makes the
  // defaults); InvalidUsage for global ranks that do not fit
  // the group or the fabric. Members create their communicators of one
  // member list in the same order (the trace names them by that order).
  OpAccounting(const AccountingOptions& options, int rank, int size);

  // This rank's simulated arrival at the next collective.
  double Arrival() const;
  // When the compute stream issued the running operation (issue_context.h):
  // its clock at the enqueue, or now for a synchronous call.
  double IssueTime() const;
  // Accounts a completed collective (`registered`: it worked in place on
  // registered buffers). May throw: the fabric model refuses a route a
  // fault cut.
  void Record(const Header& h, const Agreed& agreed, double wall_us, bool registered);
  // A message to or from `peer` (a rank of this group) on the running
  // operation's trace entry.
  void TraceMessage(bool send, int peer, std::size_t bytes, std::uint64_t tag);
  // A receive of `bytes` from `source` posted at `posted_us` and sent at
  // `send_us` completes at max(posted, sent + the modelled transfer).
  void FinishReceive(int source, std::size_t bytes, double posted_us, double send_us);

  const RecordLog& records() const { return records_; }
  CommunicatorTotals totals() const { return totals_; }
  void ResetStats();
  void WriteChromeTrace(const std::string& path) const;
  const std::shared_ptr<runtime::SimClock>& clock() const { return clock_; }
  const std::shared_ptr<const runtime::FabricModel>& fabric() const { return fabric_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  void set_join_compute(bool join) { join_compute_ = join; }

 private:
  // The fabric model's answer for an op and size, and what follows from it
  // alone (per distinct operation, not per call).
  struct Modelled {
    double micros = 0;
    std::string_view algorithm;  // the fabric's schedule
    double algbw_gbps = 0;       // bytes / micros (0 when micros is 0)
    double busbw_gbps = 0;       // algbw x the nccl-tests factor
  };
  const Modelled& Model(const Header& h, double model_bytes);
  // Where the running operation's parts are recorded when the rank's clock
  // has a trace (op_trace.h): {trace, issue index}, or {null, 0}.
  std::pair<std::shared_ptr<runtime::OpTrace>, std::uint64_t> TraceTarget(
      bool messages_lane);

  int rank_;
  int size_;
  std::shared_ptr<runtime::SimClock> clock_;
  std::shared_ptr<const runtime::FabricModel> fabric_;
  std::vector<int> global_ranks_;
  runtime::FabricAlgorithm fabric_algorithm_{};  // NEURON_FABRIC_ALGO
  double rank_delay_us_ = 0;  // this rank's straggler fault (topology rank_delays)
  std::string trace_id_;      // names the communicator in traces, equal on every member
  // The collective stream: the previous collective's end. A collective
  // starts no earlier (one stream per communicator, so communicators run
  // concurrently on other threads do not make a rank's simulated times
  // depend on which thread the host ran first).
  double stream_end_us_ = 0;
  // (op, model bytes, root) -> the fabric model's answer
  std::map<std::tuple<int, double, int>, Modelled> model_cache_;
  // The last lookup's entry (map entries stay put): a loop of one
  // collective skips the map.
  const decltype(model_cache_)::value_type* last_model_ = nullptr;
  RecordLog records_;
  CommunicatorTotals totals_;
  bool join_compute_ = true;
};

}  // namespace neuron::collectives::detail
