#include "neuron/collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string_view>

#include "algorithms.h"
#include "communicator_internal.h"
#include "issue_context.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/collectives/transport/shm_transport.h"
#include "neuron/collectives/transport/tcp_transport.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives {

using detail::Begin;
using detail::Mod;
using detail::OpCode;
using detail::OpName;
using detail::kCollectedPhase;
using detail::kHeaderSlot;
using detail::kWindowDataOffset;

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
  return std::make_shared<runtime::FabricModel>(topology,
                                                runtime::PlaceRanks(topology, ranks_per_node),
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
    case OpCode::kScatter: return CollectiveKind::kBroadcast;
    case OpCode::kReduce: return CollectiveKind::kReduce;
    case OpCode::kAllGather:
    case OpCode::kAllGatherV: return CollectiveKind::kAllGather;
    case OpCode::kReduceScatter: return CollectiveKind::kReduceScatter;
    case OpCode::kAllToAll: return CollectiveKind::kAllToAll;
    case OpCode::kAllReduce:
    case OpCode::kBarrier: return CollectiveKind::kAllReduce;
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

// Identifies this host, so ranks can tell which peers share its memory.
std::string HostIdentity(const std::string& configured) {
  if (!configured.empty()) return configured;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  std::string identity = std::string(host) + "/" + boot_id;
  // neuronrun's simulated nodes on one machine are hosts of their own.
  if (auto node = runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kNodeIndex)) {
    identity += "/node" + *node;
  }
  return identity;
}

}  // namespace

const char* Name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kBinomialTree: return "binomial_tree";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kRabenseifner: return "rabenseifner";
    case Algorithm::kBruck: return "bruck";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

Algorithm ParseAlgorithm(const std::string& name) {
  for (auto a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                 Algorithm::kBinomialTree, Algorithm::kDirect, Algorithm::kRabenseifner,
                 Algorithm::kBruck, Algorithm::kHierarchical}) {
    if (name == Name(a)) return a;
  }
  NEURON_CHECK(false, "unknown collective algorithm '", name,
               "' (auto, ring, recursive_doubling, binomial_tree, direct, rabenseifner, bruck)");
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size,
                           CommunicatorOptions options)
    : GroupContext(rank, size, options.timeout), store_(std::move(store)), options_(options),
      records_(options.max_records) {
  NEURON_CHECK(size >= 1, "communicator size must be >= 1, got ", size);
  NEURON_CHECK(rank >= 0 && rank < size, "communicator rank ", rank, " outside 0..", size - 1);
  clock_ = options_.clock ? options_.clock : std::make_shared<runtime::SimClock>();
  // Made now, in the thread that creates the group, not first in a progress
  // thread while another thread may fork (its fork handlers: shared_buffers.h).
  transport::SharedBufferPool::Instance();
  if (const auto forced =
          runtime::ConfigRegistry::Get().Find(runtime::ConfigKey::kCollectiveAlgorithm)) {
    forced_algorithm_ = ParseAlgorithm(*forced);  // read once, not on every call
  }
  fabric_algorithm_ = runtime::ConfiguredFabricAlgorithm();
  debug_ = runtime::ConfigRegistry::Get()
               .Find(runtime::ConfigKey::kCollectiveDebug)
               .value_or("0") == "1";
  global_ranks_ = options_.global_ranks;
  if (global_ranks_.empty()) {
    global_ranks_.resize(size);
    std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
  }
  trace_id_ = TraceId(global_ranks_, rank);
  NEURON_CHECK(global_ranks_.size() == static_cast<std::size_t>(size),
               "communicator: global_ranks has ", global_ranks_.size(), " entries for ", size,
               " ranks");
  fabric_ = options_.fabric ? options_.fabric
                            : DefaultFabric(*std::max_element(global_ranks_.begin(),
                                                              global_ranks_.end()) + 1);
  for (int g : global_ranks_) {
    NEURON_CHECK(g >= 0 && g < fabric_->world_size(), "communicator: global rank ", g,
                 " is not on the fabric model's ", fabric_->world_size(), " ranks");
  }
  rank_delay_us_ = fabric_->topology().RankDelay(global_ranks_[rank]).count();
  const std::string me = HostIdentity(options_.host);
  store_->Set("host/" + std::to_string(rank), me);
  std::vector<std::string> hosts(size);
  bool one_host = true;
  for (int p = 0; p < size; ++p) {
    hosts[p] = store_->Get("host/" + std::to_string(p), options_.timeout);
    one_host = one_host && hosts[p] == me;
  }
  NEURON_CHECK(one_host || options_.transport != TransportKind::kShm,
               "communicator: shared memory was asked for, but the ranks span hosts");
  if (options_.transport == TransportKind::kTcp || !one_host) {
    transport::TcpOptions tcp;
    tcp.address = options_.tcp_address;
    tcp.loopback = one_host;
    tcp.setup_timeout = options_.timeout;
    transport_ = std::make_unique<transport::TcpTransport>(*store_, rank, size, tcp);
    StartPointToPoint(false);
    if (!one_host && options_.transport == TransportKind::kAuto) BuildHierarchy(hosts);
    return;
  }
  transport::ShmOptions shm;
  shm.ring_bytes = options_.shm_ring_bytes;
  shm.window_bytes = WindowBytesFor(options_.shm_window_bytes, size_) + kWindowDataOffset;
  shm.setup_timeout = options_.timeout;
  transport_ = std::make_unique<transport::ShmTransport>(*store_, rank, size, shm);
  windows_ = transport_->windows();
  StartPointToPoint(true);
}


Communicator::Header Communicator::NewHeader(OpCode op, DataType dtype, std::uint64_t count,
                                             ReduceOp reduce, int root) const {
  Header h;
  h.op = op;
  h.dtype = dtype;
  h.count = count;
  h.reduce = reduce;
  h.root = root;
  h.published = sequence_ + 1;
  return h;
}

namespace {
// ScopedOpTimeout's override on this thread; negative: none.
thread_local std::chrono::milliseconds t_op_timeout{-1};
}  // namespace

ScopedOpTimeout::ScopedOpTimeout(std::chrono::milliseconds timeout)
    : previous_(t_op_timeout) {
  t_op_timeout = timeout;
}

ScopedOpTimeout::~ScopedOpTimeout() { t_op_timeout = previous_; }

std::chrono::milliseconds ScopedOpTimeout::Current(std::chrono::milliseconds fallback) {
  return t_op_timeout.count() >= 0 ? t_op_timeout : fallback;
}


Label Communicator::Describing(const Header& h) { return Label(&DescribeHeader, &h); }

// Made only for messages (errors, records), built with appends rather than
// StrCat's stream.
std::string Communicator::DescribeHeader(const void* header) {
  const Header& h = *static_cast<const Header*>(header);
  std::string text;
  text.reserve(96);
  text.append(OpName(h.op)).append(" #").append(std::to_string(h.sequence()));
  if (h.op != OpCode::kBarrier) {
    text.append(" of ")
        .append(h.count == detail::kPerPeerSizes ? "per-peer sizes of" : std::to_string(h.count))
        .append(" ")
        .append(Name(h.dtype));
  }
  if (h.op == OpCode::kAllReduce || h.op == OpCode::kReduceScatter || h.op == OpCode::kReduce) {
    text.append(" (").append(Name(h.reduce)).append(")");
  }
  if (h.root >= 0) text.append(" with root ").append(std::to_string(h.root));
  if (h.fingerprint != 0) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(h.fingerprint));
    text.append(" (block sizes ").append(hex).append(")");
  }
  if (h.op == OpCode::kAllReduce) {
    text.append(" by ").append(Name(static_cast<Algorithm>(h.algorithm)));
    if (h.path == detail::kPathStaged) text.append(" (staged)");
    if (h.path == detail::kPathHeaderSlot) text.append(" (in the header slots)");
    if (h.path == detail::kPathHeaderLine) text.append(" (in the header line)");
  }
  return text;
}

void Communicator::CheckHeaders(const Header& mine, const Header* const* theirs) {
  std::vector<int> differ;
  for (int r = 0; r < size_; ++r) {
    if (!(*theirs[r] == mine)) differ.push_back(r);
  }
  if (differ.empty()) return;
  std::string message = StrCat("mismatched collectives: rank ", rank_, " called ",
                               DescribeHeader(&mine), " but rank ", differ[0], " called ",
                               DescribeHeader(theirs[differ[0]]));
  if (debug_) {
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    message += StrCat(" (NEURON_CC_DEBUG: ranks differing from rank ", rank_, ": ", ranks, ")");
  }
  transport_->Abort(message);
  throw InvalidUsage(message);
}

std::size_t Communicator::SlotOffset() const { return (sequence_ % 2) * kHeaderSlot; }

char* Communicator::InlineData(int rank) const {
  return windows_->Window(rank) + SlotOffset() + detail::kHeaderBytes;
}

const unsigned char* Communicator::TinyData(int rank) const {
  return reinterpret_cast<const Header*>(windows_->Window(rank) + SlotOffset())->tiny;
}

Communicator::Agreed Communicator::Handshake(Header& mine, const void* staged,
                                             std::size_t staged_bytes, const void* slot_data,
                                             std::size_t slot_bytes) {
  ++sequence_;
  registered_op_ = false;
  // A straggler (rank_delays fault) reaches every collective that much later.
  mine.arrival_us = std::max(IssueTime(), stream_end_us_) + rank_delay_us_;
  const Agreed agreed{mine.arrival_us, mine.model_bytes};
  if (size_ == 1) return agreed;
  if (windows_ != nullptr) {
    return ShmHandshake(mine, agreed, staged, staged_bytes, slot_data, slot_bytes);
  }
  return RingHandshake(mine, agreed);
}

Communicator::Agreed Communicator::ShmHandshake(Header& mine, Agreed agreed, const void* staged,
                                                std::size_t staged_bytes, const void* slot_data,
                                                std::size_t slot_bytes) {
  const Label what = Describing(mine);
  const std::size_t slot = SlotOffset();
  static_assert(sizeof(Header) <= detail::kHeaderBytes, "header slot too small");
  if (mine.path == detail::kPathHeaderLine) {
    NEURON_CHECK(staged_bytes <= detail::kTinyBytes, what, ": ", staged_bytes,
                 " bytes do not fit a header");
    if (staged_bytes > 0) std::memcpy(mine.tiny, staged, staged_bytes);
  } else if (mine.path == detail::kPathHeaderSlot) {
    NEURON_CHECK(staged_bytes <= detail::kInlineBytes, what, ": ", staged_bytes,
                 " bytes do not fit a header slot");
    if (staged_bytes > 0) std::memcpy(InlineData(rank_), staged, staged_bytes);
  } else if (staged_bytes > 0) {
    // The data area is free once every rank collected its last use.
    windows_->WaitPhase(kCollectedPhase, window_sequence_, NewDeadline(), what);
    std::memcpy(WindowData(rank_), staged, staged_bytes);
  }
  if (slot_bytes > 0) {
    NEURON_ASSERT(mine.path != detail::kPathHeaderSlot && slot_bytes <= detail::kInlineBytes,
                  what, ": slot data does not fit");
    std::memcpy(InlineData(rank_), slot_data, slot_bytes);
  }
  // The header's `published`, stored last, is the handshake's flag: a
  // peer polls the header's own cache line.
  // Everything but the flag, which peers may be reading (atomically).
  static_assert(offsetof(Header, published) + sizeof(Header::published) == sizeof(Header),
                "Header::published must be its last member");
  // The flag's store follows the header's at once: a peer polling the line
  // between the two would take it back, and the flag store would wait for
  // the line a second time.
  NEURON_ASSERT(mine.published == sequence_, what, ": header made for another collective");
  const std::size_t flag = slot + offsetof(Header, published);
  const transport::Deadline deadline = NewDeadline();
  std::memcpy(windows_->Window(rank_) + slot, &mine, offsetof(Header, published));
  windows_->SyncWindowWord(flag, mine.published, deadline, what);
  if (mine.path == detail::kPathHeaderSlot) {
    // The headers' lines are here (their flags were); start fetching the
    // inline data now, while the headers are checked.
    for (int r = 0; r < size_; ++r) __builtin_prefetch(InlineData(r));
  }
  header_views_.resize(static_cast<std::size_t>(size_));
  const Header** theirs = header_views_.data();
  for (int r = 0; r < size_; ++r) {
    // This rank's own from its local copy: the shared line may still wait
    // in the store buffer for the cache line (peers poll it), and a load
    // from it would wait too.
    theirs[r] = r == rank_ ? &mine : reinterpret_cast<const Header*>(windows_->Window(r) + slot);
    agreed.start_us = std::max(agreed.start_us, theirs[r]->arrival_us);
    agreed.model_bytes = std::max(agreed.model_bytes, theirs[r]->model_bytes);
  }
  CheckHeaders(mine, theirs);
  return agreed;
}

Communicator::Agreed Communicator::RingHandshake(const Header& mine, Agreed agreed) {
  const int right_rank = Mod(rank_ + 1, size_), left_rank = Mod(rank_ - 1, size_);
  if (debug_) {  // every rank sees every header: a ring allgather of them
    std::vector<Header> all(size_);
    all[rank_] = mine;
    for (int k = 0; k < size_ - 1; ++k) {
      Exchange(right_rank, &all[Mod(rank_ - k, size_)], sizeof(Header), left_rank,
               &all[Mod(rank_ - k - 1, size_)], sizeof(Header), Describing(mine));
    }
    std::vector<const Header*> theirs(size_);
    for (int r = 0; r < size_; ++r) theirs[r] = &all[r];
    CheckHeaders(mine, theirs.data());
    return RingMax(agreed, Describing(mine));
  }
  Header left;
  Exchange(right_rank, &mine, sizeof(mine), left_rank, &left, sizeof(left), Describing(mine));
  if (!(left == mine)) {
    std::vector<const Header*> theirs(size_, &mine);
    theirs[left_rank] = &left;
    CheckHeaders(mine, theirs.data());
  }
  return RingMax(agreed, Describing(mine));
}

Communicator::Agreed Communicator::RingMax(Agreed mine, const Label& what) {
  // n-1 steps: after step k each rank holds the maximum over k+2 ranks.
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  Agreed current = mine;
  for (int k = 0; k < size_ - 1; ++k) {
    Agreed in;
    Exchange(right, &current, sizeof(current), left, &in, sizeof(in), what);
    current.start_us = std::max(current.start_us, in.start_us);
    current.model_bytes = std::max(current.model_bytes, in.model_bytes);
  }
  return current;
}

const Communicator::Modelled& Communicator::Model(const Header& h, double bytes) {
  const auto key = std::make_tuple(static_cast<int>(h.op), bytes, h.root);
  if (last_model_ == nullptr || key != last_model_->first) {
    auto cached = model_cache_.find(key);
    if (cached == model_cache_.end()) {
      const runtime::CollectiveCost cost = runtime::ModelCollective(
          *fabric_, FabricName(h.op), bytes, global_ranks_, std::max(h.root, 0),
          fabric_algorithm_);
      Modelled m;
      m.micros = cost.micros;
      m.algorithm = cost.algorithm;
      if (m.micros > 0) {
        m.algbw_gbps = bytes / m.micros / 1e3;
        m.busbw_gbps = m.algbw_gbps * runtime::BusBandwidthFactor(FabricKind(h.op), size_);
      }
      cached = model_cache_.emplace(key, m).first;
    }
    last_model_ = &*cached;
  }
  return last_model_->second;
}

void Communicator::Record(const Header& h, const Agreed& agreed, double arrival_us,
                          double wall_us) {
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
  r.arrival_us = arrival_us;
  r.start_us = agreed.start_us;
  r.end_us = agreed.start_us + r.modelled_us;
  r.registered = registered_op_;
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

double Communicator::IssueTime() const {
  const detail::IssueContext* context = detail::ScopedIssue::Current(clock_.get());
  return context != nullptr ? context->issued_us : clock_->compute().count();
}

std::pair<std::shared_ptr<runtime::OpTrace>, std::uint64_t> Communicator::TraceTarget(
    bool messages_lane) {
  if (const auto* context = detail::ScopedIssue::Current(clock_.get())) {
    return {context->trace, context->index};
  }
  if (!clock_->tracing()) return {nullptr, 0};  // the common case: no lock taken
  std::shared_ptr<runtime::OpTrace> trace = clock_->trace();
  if (trace == nullptr) return {nullptr, 0};
  const std::uint64_t issue = trace->Issue(messages_lane, join_compute_);
  return {std::move(trace), issue};
}

void Communicator::ResetStats() {
  records_.clear();
  totals_ = {};
}

void Communicator::WriteChromeTrace(const std::string& path) const {
  std::ofstream out(path);
  NEURON_CHECK(out.good(), "cannot write Chrome trace ", path);
  out << "{\"traceEvents\": [\n";
  bool first = true;
  double wall_cursor = 0;  // wall events are laid end to end per rank
  for (const auto& r : records_) {
    for (int clock = 0; clock < 2; ++clock) {
      const bool sim = clock == 1;
      out << (first ? "" : ",\n") << "{\"name\": \"" << r.op << " #" << r.sequence
          << "\", \"ph\": \"X\", \"pid\": \"" << (sim ? "simulated" : "wall")
          << "\", \"tid\": " << rank_ << ", \"ts\": " << (sim ? r.start_us : wall_cursor)
          << ", \"dur\": " << (sim ? r.modelled_us : r.wall_us) << ", \"args\": {\"bytes\": "
          << r.bytes << ", \"algorithm\": \"" << r.fabric_algorithm
          << "\", \"busbw_gbps\": " << r.busbw_gbps << "}}";
      first = false;
    }
    wall_cursor += r.wall_us;
  }
  out << "\n]}\n";
}

void Communicator::Abort(const std::string& reason) {
  transport_->Abort(reason);
  AbortPointToPoint(reason);
}

Algorithm Communicator::AllReduceAlgorithm(Algorithm requested, std::size_t bytes,
                                           std::size_t count) const {
  Algorithm algorithm = requested;
  if (algorithm == Algorithm::kAuto) algorithm = forced_algorithm_;
  if (algorithm == Algorithm::kAuto) {
    if (local_ != nullptr) {
      algorithm = Algorithm::kHierarchical;
    } else if (windows_ != nullptr) {
      algorithm = Algorithm::kDirect;
    } else {
      algorithm = bytes <= options_.small_message_bytes || count < static_cast<std::size_t>(size_)
                      ? Algorithm::kRecursiveDoubling
                      : Algorithm::kRing;
    }
  }
  NEURON_CHECK(algorithm != Algorithm::kDirect || windows_ != nullptr,
               "allreduce: the direct algorithm needs every rank on one host");
  NEURON_CHECK(algorithm != Algorithm::kHierarchical || local_ != nullptr,
               "allreduce: the hierarchical algorithm needs ranks on several hosts, several "
               "on one host at least (automatic transport)");
  NEURON_CHECK(algorithm != Algorithm::kBinomialTree && algorithm != Algorithm::kBruck,
               "allreduce: algorithm ", Name(algorithm), " does not implement it");
  return algorithm;
}

void Communicator::AllReduce(const AllReduceOptions& o) {
  CheckReducible(o.dtype, o.op, "allreduce");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "allreduce: data is null");
  Header h = NewHeader(OpCode::kAllReduce, o.dtype, o.count, o.op);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  const Algorithm algorithm = AllReduceAlgorithm(o.algorithm, bytes, o.count);
  h.algorithm = static_cast<std::uint8_t>(algorithm);  // all ranks must agree
  char* data = static_cast<char*>(o.data);
  const Label what = Describing(h);
  const bool small = algorithm == Algorithm::kDirect && size_ > 1 &&
                     bytes <= std::min(options_.small_message_bytes, WindowDataBytes());
  // Data that fits the windows is staged with the header: one phase fewer;
  // data that fits a header slot goes with the header itself.
  const bool staged = algorithm == Algorithm::kDirect && size_ > 1 && bytes <= WindowDataBytes();
  // Ranks with other options must not mix paths: the header says which.
  h.path = !small                         ? detail::kPathAlgorithm
           : bytes <= detail::kTinyBytes   ? detail::kPathHeaderLine
           : bytes <= detail::kInlineBytes ? detail::kPathHeaderSlot
                                           : detail::kPathStaged;
  h.model_bytes = static_cast<double>(bytes);
  // A large direct allreduce shows every rank where its buffer lives when
  // it is registered (SharedBufferPool): when all are, nothing is staged.
  const bool sliced = algorithm == Algorithm::kDirect && size_ > 1 && !small;
  transport::SharedRegion region;
  if (sliced) {
    if (auto found = transport::SharedBufferPool::Instance().Find(data, bytes)) region = *found;
  }
  const bool stage = staged && region.fd < 0;
  const Agreed agreed = Handshake(h, stage ? data : nullptr, stage ? bytes : 0,
                                  sliced ? &region : nullptr, sliced ? sizeof(region) : 0);
  const OpScope scope(*this, h, agreed);
  if (size_ == 1 || o.count == 0) {
    if (o.op == ReduceOp::kAvg && o.count > 0) FinishAverage(o.dtype, o.data, o.count, 1);
    return;
  }
  switch (algorithm) {
    case Algorithm::kRing: {
      RingReduceScatter(*this, data, EvenChunks(o.count), o.dtype, o.op, what);
      if (o.op == ReduceOp::kAvg) {
        const std::size_t begin = Begin(o.count, size_, rank_);
        const std::size_t esize = ElementSize(o.dtype);
        FinishAverage(o.dtype, data + begin * esize, Begin(o.count, size_, rank_ + 1) - begin,
                      static_cast<std::size_t>(size_));
      }
      RingAllGather(*this, data, o.count, o.dtype, what);
      return;
    }
    case Algorithm::kRecursiveDoubling:
      RecursiveDoublingAllReduce(*this, data, o.count, o.dtype, o.op, what);
      return;
    case Algorithm::kRabenseifner:
      RabenseifnerAllReduce(*this, data, o.count, o.dtype, o.op, what);
      return;
    case Algorithm::kHierarchical:
      HierarchicalAllReduce(data, o.count, o.dtype, o.op);
      return;
    default:
      if (small) {
        SmallDirectAllReduce(data, o.count, o.dtype, o.op, h.path);
        return;
      }
      bool none_registered = false;
      if (!RegisteredDirectAllReduce(data, o.count, o.dtype, o.op, what, &none_registered)) {
        // Staged by the handshake only if every rank staged.
        DirectAllReduce(*this, data, o.count, o.dtype, o.op, what, staged && none_registered);
      }
      return;
  }
}

std::vector<std::size_t> Communicator::EvenChunks(std::size_t count) const {
  std::vector<std::size_t> chunks(size_ + 1);
  for (int c = 0; c <= size_; ++c) chunks[c] = Begin(count, size_, c);
  return chunks;
}

// Binomial tree broadcast (as in MPICH): relative rank v receives from
// v - 2^k for the lowest set bit k, then sends to v + 2^j for j < k.
void Communicator::Broadcast(const BroadcastOptions& o) {
  NEURON_CHECK(o.root >= 0 && o.root < size_, "broadcast: root ", o.root, " outside 0..",
               size_ - 1);
  NEURON_CHECK(o.data != nullptr || o.count == 0, "broadcast: data is null");
  Header h = NewHeader(OpCode::kBroadcast, o.dtype, o.count, ReduceOp::kSum, o.root);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype));
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  if (size_ == 1 || bytes == 0) return;
  if (local_ != nullptr) {
    HierarchicalBroadcast(o.data, o.count, o.dtype, o.root);
    return;
  }
  const Label what = Describing(h);
  const int v = Mod(rank_ - o.root, size_);
  int mask = 1;
  while (mask < size_) {
    if (v & mask) {
      const int from = Mod(v - mask + o.root, size_);
      transport_->Wait({transport_->Irecv(from, o.data, bytes)}, NewDeadline(), what);
      break;
    }
    mask <<= 1;
  }
  std::vector<transport::RequestId> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < size_) sends.push_back(transport_->Isend(Mod(v + mask + o.root, size_), o.data, bytes));
  }
  transport_->Wait(sends, NewDeadline(), what);
}

void Communicator::AllGather(const AllGatherOptions& o) {
  NEURON_CHECK((o.input != nullptr && o.output != nullptr) || o.count == 0,
               "allgather: input or output is null");
  Header h = NewHeader(OpCode::kAllGather, o.dtype, o.count);
  h.model_bytes = static_cast<double>(o.count * ElementSize(o.dtype) * size_);
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const std::size_t block = o.count * ElementSize(o.dtype);
  char* out = static_cast<char*>(o.output);
  if (block == 0) return;
  Algorithm algorithm = o.algorithm;
  if (algorithm == Algorithm::kAuto) {
    algorithm = local_ != nullptr ? Algorithm::kHierarchical
                                  : block <= 4096 ? Algorithm::kBruck : Algorithm::kRing;
  }
  NEURON_CHECK(algorithm == Algorithm::kRing || algorithm == Algorithm::kBruck ||
                   algorithm == Algorithm::kHierarchical,
               "allgather: algorithm ", Name(algorithm), " does not implement it");
  NEURON_CHECK(algorithm != Algorithm::kHierarchical || local_ != nullptr,
               "allgather: the hierarchical algorithm needs ranks on several hosts, several "
               "on one host at least (automatic transport)");
  if (algorithm == Algorithm::kHierarchical) {
    HierarchicalAllGather(out, o.input, o.count, o.dtype);
    return;
  }
  if (algorithm == Algorithm::kBruck && size_ > 1) {
    BruckAllGather(*this, out, o.input, block, Describing(h));
    return;
  }
  if (out + rank_ * block != o.input) std::memmove(out + rank_ * block, o.input, block);
  if (size_ > 1) RingAllGather(*this, out, o.count * size_, o.dtype, Describing(h));
}

void Communicator::ReduceScatter(const ReduceScatterOptions& o) {
  CheckReducible(o.dtype, o.op, "reducescatter");
  const bool uneven = !o.counts.empty();
  NEURON_CHECK(!uneven || o.counts.size() == static_cast<std::size_t>(size_),
               "reducescatter: counts needs one entry per rank (", size_, "), got ",
               o.counts.size());
  std::vector<std::size_t> chunks(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) chunks[r + 1] = chunks[r] + (uneven ? o.counts[r] : o.count);
  const std::size_t esize = ElementSize(o.dtype);
  const std::size_t mine = chunks[rank_ + 1] - chunks[rank_];
  NEURON_CHECK((o.input != nullptr || chunks.back() == 0) && (o.output != nullptr || mine == 0),
               "reducescatter: input or output is null");
  // The whole input's size: equal calls have equal totals.
  Header h = NewHeader(OpCode::kReduceScatter, o.dtype, chunks.back(), o.op);
  h.fingerprint = Fingerprint(o.counts);
  h.model_bytes = static_cast<double>(chunks.back() * esize);
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  if (chunks.back() == 0) return;
  if (windows_ != nullptr && size_ > 1) {
    DirectReduceScatter(*this, static_cast<const char*>(o.input), static_cast<char*>(o.output),
                        chunks, o.dtype, o.op, Describing(h));
    return;
  }
  std::vector<char> work(static_cast<const char*>(o.input),
                         static_cast<const char*>(o.input) + chunks.back() * esize);
  if (size_ > 1) RingReduceScatter(*this, work.data(), chunks, o.dtype, o.op, Describing(h));
  char* block = work.data() + chunks[rank_] * esize;
  if (o.op == ReduceOp::kAvg && mine > 0) {
    FinishAverage(o.dtype, block, mine, static_cast<std::size_t>(size_));
  }
  if (mine > 0) std::memcpy(o.output, block, mine * esize);
}

// Dissemination barrier (Hensgen, Finkel & Manber, "Two algorithms for
// barrier synchronization", 1988): ceil(log2 n) rounds of one byte.
void Communicator::Barrier() {
  Header h = NewHeader(OpCode::kBarrier, DataType::kFloat32, 0);
  h.model_bytes = 0;
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const Label what = Describing(h);
  char out = 1, in = 0;
  for (int k = 1; k < size_; k *= 2) {
    Exchange(Mod(rank_ + k, size_), &out, 1, Mod(rank_ - k, size_), &in, 1, what);
  }
}

}  // namespace neuron::collectives
