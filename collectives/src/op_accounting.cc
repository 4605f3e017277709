#include "op_accounting.h"

#include <algorithm>
#include <sstream>
#include <mutex>
#include <numeric>

#include "issue_context.h"
#include "wire.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives::detail {

namespace {

// The job's fabric with `world` ranks placed as neuronrun places them:
// LOCAL_WORLD_SIZE per node (all on one node when unset), filling nodes of
// the topology in NEURON_TOPOLOGY_FILE (or the embedded trn2 node).
std::shared_ptr<const runtime::FabricModel> DefaultFabric(int world) {
  const runtime::Topology topology = runtime::Topology::FromEnvironment();
  const auto& reg = runtime::ConfigRegistry::Get();
  const int slots = static_cast<int>(topology.spec().chips_per_node() *
                                     topology.spec().ranks_per_chip());
  int per_node = reg.Find(runtime::ConfigKey::kLocalWorldSize)
                     ? static_cast<int>(reg.GetInt(runtime::ConfigKey::kLocalWorldSize))
                     : world;
  per_node = std::max(1, std::min(per_node, slots));
  std::vector<std::uint32_t> ranks_per_node;
  for (int left = world; left > 0; left -= per_node) {
    ranks_per_node.push_back(static_cast<std::uint32_t>(std::min(left, per_node)));
  }
  return std::make_shared<runtime::FabricModel>(
      topology, runtime::PlaceRanks(topology, ranks_per_node),
      runtime::DeviceSpec::FromEnvironment());
}

// The fabric model's collective for an op: barrier is a zero-byte
// allreduce; gather and scatter (modelled by their own linear schedule)
// count like a broadcast for bus bandwidth (factor 1).
runtime::CollectiveKind FabricKind(OpCode op) {
  using runtime::CollectiveKind;
  switch (op) {
    case OpCode::kBroadcast:
    case OpCode::kGather:
    case OpCode::kScatter:
      return CollectiveKind::kBroadcast;
    case OpCode::kReduce:
      return CollectiveKind::kReduce;
    case OpCode::kAllGather:
    case OpCode::kAllGatherV:
      return CollectiveKind::kAllGather;
    case OpCode::kReduceScatter:
      return CollectiveKind::kReduceScatter;
    case OpCode::kAllToAll:
      return CollectiveKind::kAllToAll;
    case OpCode::kAllReduce:
    case OpCode::kBarrier:
      return CollectiveKind::kAllReduce;
  }
  return CollectiveKind::kAllReduce;
}

// The op's name for the fabric model (ModelCollective) and the trace.
const char* FabricName(OpCode op) {
  if (op == OpCode::kGather) return "gather";
  if (op == OpCode::kScatter) return "scatter";
  return runtime::Name(FabricKind(op));
}

// Members create the communicators of one member list in the same order,
// so "member list #k" names the same communicator on each of them.
std::string TraceId(const std::vector<int>& members, int rank) {
  static std::mutex mutex;
  static std::map<std::string, int> created;  // "members/rank" -> count
  std::string key;
  for (int g : members) key += (key.empty() ? "" : ",") + std::to_string(g);
  std::lock_guard<std::mutex> lock(mutex);
  return StrCat(key, "#", created[StrCat(key, "/", members[rank])]++);
}

}  // namespace

OpAccounting::OpAccounting(const AccountingOptions& options, int rank, int size)
    : rank_(rank),
      size_(size),
      clock_(options.clock ? options.clock : std::make_shared<runtime::SimClock>()),
      global_ranks_(options.global_ranks),
      fabric_algorithm_(runtime::ConfiguredFabricAlgorithm()),
      records_(options.max_records) {
  if (global_ranks_.empty()) {
    global_ranks_.resize(size);
    std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
  }
  NEURON_CHECK(global_ranks_.size() == static_cast<std::size_t>(size),
               "communicator: global_ranks has ", global_ranks_.size(), " entries for ",
               size, " ranks");
  trace_id_ = TraceId(global_ranks_, rank);
  fabric_ = options.fabric
                ? options.fabric
                : DefaultFabric(
                      *std::max_element(global_ranks_.begin(), global_ranks_.end()) + 1);
  for (int g : global_ranks_) {
    NEURON_CHECK(g >= 0 && g < fabric_->world_size(), "communicator: global rank ", g,
                 " is not on the fabric model's ", fabric_->world_size(), " ranks");
  }
  rank_delay_us_ = fabric_->topology().RankDelay(global_ranks_[rank]).count();
}

double OpAccounting::Arrival() const {
  // A straggler (rank_delays fault) reaches every collective that much later.
  return std::max(IssueTime(), stream_end_us_) + rank_delay_us_;
}

double OpAccounting::IssueTime() const {
  const IssueContext* context = ScopedIssue::Current(clock_.get());
  return context != nullptr ? context->issued_us : clock_->compute().count();
}

const OpAccounting::Modelled& OpAccounting::Model(const Header& h, double bytes) {
  const auto key = std::make_tuple(static_cast<int>(h.op), bytes, h.root);
  if (last_model_ == nullptr || key != last_model_->first) {
    auto cached = model_cache_.find(key);
    if (cached == model_cache_.end()) {
      const runtime::CollectiveCost cost =
          runtime::ModelCollective(*fabric_, FabricName(h.op), bytes, global_ranks_,
                                   std::max(h.root, 0), fabric_algorithm_);
      Modelled m;
      m.micros = cost.micros;
      m.algorithm = cost.algorithm;
      if (m.micros > 0) {
        m.algbw_gbps = bytes / m.micros / 1e3;
        m.busbw_gbps =
            m.algbw_gbps * runtime::BusBandwidthFactor(FabricKind(h.op), size_);
      }
      cached = model_cache_.emplace(key, m).first;
    }
    last_model_ = &*cached;
  }
  return last_model_->second;
}

void OpAccounting::Record(const Header& h, const Agreed& agreed, double wall_us,
                          bool registered) {
  const Modelled& m = Model(h, agreed.model_bytes);  // may throw: before the record
  OpRecord& r = records_.Append();  // filled in place: no copy per operation
  r.op = OpName(h.op);
  r.sequence = h.sequence();
  r.bytes = agreed.model_bytes;
  r.wall_us = wall_us;
  r.modelled_us = m.micros;
  r.fabric_algorithm = m.algorithm;
  r.algbw_gbps = m.algbw_gbps;
  r.busbw_gbps = m.busbw_gbps;
  r.arrival_us = h.arrival_us;
  r.start_us = agreed.start_us;
  r.end_us = agreed.start_us + r.modelled_us;
  r.registered = registered;
  stream_end_us_ = std::max(stream_end_us_, r.end_us);
  clock_->FinishCollective(runtime::SimDuration(r.end_us));
  if (join_compute_) clock_->JoinCompute(runtime::SimDuration(r.end_us));
  if (auto [trace, issue] = TraceTarget(false); trace != nullptr) {
    runtime::proto::TraceCollective part;
    part.set_kind(FabricName(h.op));
    for (int g : global_ranks_) part.add_group(g);
    part.set_communicator(trace_id_);
    part.set_sequence(h.sequence());
    part.set_bytes(agreed.model_bytes);
    part.set_root(std::max(h.root, 0));
    trace->AddCollective(issue, std::move(part));
  }
  totals_.operations += 1;
  totals_.bytes += r.bytes;
  totals_.wall_us += r.wall_us;
  totals_.modelled_us += r.modelled_us;
  totals_.waited_us += r.start_us - r.arrival_us;
}

std::pair<std::shared_ptr<runtime::OpTrace>, std::uint64_t> OpAccounting::TraceTarget(
    bool messages_lane) {
  if (const auto* context = ScopedIssue::Current(clock_.get())) {
    return {context->trace, context->index};
  }
  if (!clock_->tracing()) return {nullptr, 0};  // the common case: no lock taken
  std::shared_ptr<runtime::OpTrace> trace = clock_->trace();
  if (trace == nullptr) return {nullptr, 0};
  const std::uint64_t issue = trace->Issue(messages_lane, join_compute_);
  return {std::move(trace), issue};
}

void OpAccounting::TraceMessage(bool send, int peer, std::size_t bytes,
                                std::uint64_t tag) {
  auto [trace, issue] = TraceTarget(true);
  if (trace == nullptr) return;
  runtime::proto::TraceMessage part;
  part.set_send(send);
  part.set_peer(global_ranks_[peer]);
  part.set_bytes(static_cast<double>(bytes));
  part.set_tag(tag);
  part.set_communicator(trace_id_);
  trace->AddMessage(issue, std::move(part));
}

void OpAccounting::FinishReceive(int source, std::size_t bytes, double posted_us,
                                 double send_us) {
  const runtime::Schedule transfer = runtime::PointToPointSchedule(
      global_ranks_[source], global_ranks_[rank_], static_cast<double>(bytes));
  const double modelled = fabric_->Simulate(transfer).total.count();
  const double end = std::max(posted_us, send_us + modelled);
  if (join_compute_) clock_->JoinCompute(runtime::SimDuration(end));
  if (auto* context = ScopedIssue::Current(clock_.get())) {
    context->received = true;  // the waiter joins it
    context->received_us = std::max(context->received_us, end);
  }
}

void OpAccounting::ResetStats() {
  records_.clear();
  totals_ = {};
}

void OpAccounting::WriteChromeTrace(const std::string& path) const {
  std::ostringstream out;
  out << "{\"traceEvents\": [\n";
  bool first = true;
  double wall_cursor = 0;  // wall events are laid end to end per rank
  for (const auto& r : records_) {
    for (int clock = 0; clock < 2; ++clock) {
      const bool sim = clock == 1;
      out << (first ? "" : ",\n") << "{\"name\": \"" << r.op << " #" << r.sequence
          << "\", \"ph\": \"X\", \"pid\": \"" << (sim ? "simulated" : "wall")
          << "\", \"tid\": " << rank_ << ", \"ts\": " << (sim ? r.start_us : wall_cursor)
          << ", \"dur\": " << (sim ? r.modelled_us : r.wall_us)
          << ", \"args\": {\"bytes\": " << r.bytes << ", \"algorithm\": \""
          << r.fabric_algorithm << "\", \"busbw_gbps\": " << r.busbw_gbps << "}}";
      first = false;
    }
    wall_cursor += r.wall_us;
  }
  out << "\n]}\n";
  runtime::WriteFileAtomically(path, out.str());  // IoError naming the path
}

}  // namespace neuron::collectives::detail
