#include "neuron/collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include "communicator_internal.h"
#include "issue_context.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/store/prefix_store.h"
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
using detail::kReducedPhase;
using detail::kStagedPhase;
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
                                                runtime::PlaceRanks(topology, ranks_per_node));
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
    : store_(std::move(store)), rank_(rank), size_(size), options_(options) {
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
  auto transport = std::make_unique<transport::ShmTransport>(*store_, rank, size, shm);
  shm_ = transport.get();
  transport_ = std::move(transport);
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
  h.sequence = sequence_;
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

transport::Deadline Communicator::NewDeadline() const {
  return transport::Deadline::After(ScopedOpTimeout::Current(options_.timeout));
}

std::string Communicator::Describe(const Header& h) const { return DescribeHeader(&h); }

Label Communicator::Describing(const Header& h) { return Label(&DescribeHeader, &h); }

// Made only for messages (errors, records), built with appends rather than
// StrCat's stream.
std::string Communicator::DescribeHeader(const void* header) {
  const Header& h = *static_cast<const Header*>(header);
  std::string text;
  text.reserve(96);
  text.append(OpName(h.op)).append(" #").append(std::to_string(h.sequence));
  if (h.op != OpCode::kBarrier) {
    text.append(" of ").append(std::to_string(h.count)).append(" ").append(Name(h.dtype));
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
  }
  return text;
}

void Communicator::Exchange(int send_to, const void* send, std::size_t send_bytes,
                            int recv_from, void* recv, std::size_t recv_bytes,
                            const Label& what) {
  const auto s = transport_->Isend(send_to, send, send_bytes);
  const auto r = transport_->Irecv(recv_from, recv, recv_bytes);
  transport_->Wait({s, r}, NewDeadline(), what);
}

char* Communicator::WindowData(int rank) const { return shm_->Window(rank) + kWindowDataOffset; }

std::size_t Communicator::WindowDataBytes() const {
  return shm_->window_bytes() - kWindowDataOffset;
}

void Communicator::CheckHeaders(const Header& mine, const Header* const* theirs) {
  std::vector<int> differ;
  for (int r = 0; r < size_; ++r) {
    if (!(*theirs[r] == mine)) differ.push_back(r);
  }
  if (differ.empty()) return;
  std::string message = StrCat("mismatched collectives: rank ", rank_, " called ",
                               Describe(mine), " but rank ", differ[0], " called ",
                               Describe(*theirs[differ[0]]));
  if (debug_) {
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    message += StrCat(" (NEURON_CC_DEBUG: ranks differing from rank ", rank_, ": ", ranks, ")");
  }
  transport_->Abort(message);
  throw InvalidUsage(message);
}

char* Communicator::InlineData(int rank) const {
  return shm_->Window(rank) + (sequence_ % 2) * kHeaderSlot + detail::kHeaderBytes;
}

Communicator::Agreed Communicator::Handshake(Header& mine, const void* staged,
                                             std::size_t staged_bytes, const void* slot_data,
                                             std::size_t slot_bytes) {
  ++sequence_;
  registered_op_ = false;
  // A straggler (rank_delays fault) reaches every collective that much later.
  mine.arrival_us = std::max(IssueTime(), stream_end_us_) +
                    fabric_->topology().RankDelay(global_ranks_[rank_]).count();
  Agreed agreed{mine.arrival_us, mine.model_bytes};
  if (size_ == 1) return agreed;
  if (shm_ != nullptr) {
    const Label what = Describing(mine);
    const std::size_t slot = (sequence_ % 2) * kHeaderSlot;
    static_assert(sizeof(Header) <= detail::kHeaderBytes, "header slot too small");
    if (mine.path == detail::kPathHeaderSlot) {
      NEURON_CHECK(staged_bytes <= detail::kInlineBytes, what, ": ", staged_bytes,
                   " bytes do not fit a header slot");
      if (staged_bytes > 0) std::memcpy(InlineData(rank_), staged, staged_bytes);
    } else if (staged_bytes > 0) {
      // The data area is free once every rank collected its last use.
      shm_->WaitPhase(kCollectedPhase, window_sequence_, NewDeadline(), what);
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
    std::memcpy(shm_->Window(rank_) + slot, &mine, offsetof(Header, published));
    const std::size_t flag = slot + offsetof(Header, published);
    shm_->SyncWindowWord(flag, sequence_, NewDeadline(), what);
    if (mine.path == detail::kPathHeaderSlot) {
      // The headers' lines are here (their flags were); start fetching the
      // inline data now, while the headers are checked.
      for (int r = 0; r < size_; ++r) __builtin_prefetch(InlineData(r));
    }
    header_views_.resize(static_cast<std::size_t>(size_));
    const Header** theirs = header_views_.data();
    for (int r = 0; r < size_; ++r) {
      theirs[r] = reinterpret_cast<const Header*>(shm_->Window(r) + slot);
      agreed.start_us = std::max(agreed.start_us, theirs[r]->arrival_us);
      agreed.model_bytes = std::max(agreed.model_bytes, theirs[r]->model_bytes);
    }
    CheckHeaders(mine, theirs);
    return agreed;
  }
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

double Communicator::ModelledMicros(const Header& h, double bytes, std::string* algorithm) {
  const auto key = std::make_tuple(static_cast<int>(h.op), bytes, h.root);
  if (last_model_ == nullptr || key != last_model_key_) {
    auto cached = model_cache_.find(key);
    if (cached == model_cache_.end()) {
      const runtime::CollectiveCost cost = runtime::ModelCollective(
          *fabric_, FabricName(h.op), bytes, global_ranks_, std::max(h.root, 0));
      cached = model_cache_.emplace(key, std::make_pair(cost.micros, cost.algorithm)).first;
    }
    last_model_key_ = key;
    last_model_ = &cached->second;  // map entries stay put
  }
  *algorithm = last_model_->second;
  return last_model_->first;
}

void Communicator::Record(const Header& h, const Agreed& agreed, double arrival_us,
                          double wall_us) {
  if (records_.size() >= options_.max_records && !records_.empty()) records_.pop_front();
  OpRecord& r = records_.emplace_back();  // filled in place: no copy per operation
  r.op = OpName(h.op);
  r.sequence = h.sequence;
  r.bytes = agreed.model_bytes;
  r.wall_us = wall_us;
  r.modelled_us = ModelledMicros(h, agreed.model_bytes, &r.fabric_algorithm);
  r.arrival_us = arrival_us;
  r.start_us = agreed.start_us;
  r.end_us = agreed.start_us + r.modelled_us;
  r.registered = registered_op_;
  if (r.modelled_us > 0) {
    r.algbw_gbps = r.bytes / r.modelled_us / 1e3;
    r.busbw_gbps = r.algbw_gbps * runtime::BusBandwidthFactor(FabricKind(h.op), size_);
  }
  stream_end_us_ = std::max(stream_end_us_, r.end_us);
  clock_->FinishCollective(runtime::SimDuration(r.end_us));
  if (join_compute_) clock_->JoinCompute(runtime::SimDuration(r.end_us));
  if (auto [trace, issue] = TraceTarget(false); trace != nullptr) {
    runtime::proto::TraceCollective part;
    part.set_kind(FabricName(h.op));
    for (int g : global_ranks_) part.add_group(g);
    part.set_communicator(trace_id_);
    part.set_sequence(h.sequence);
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

void Communicator::AllReduce(const AllReduceOptions& o) {
  CheckReducible(o.dtype, o.op, "allreduce");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "allreduce: data is null");
  Header h = NewHeader(OpCode::kAllReduce, o.dtype, o.count, o.op);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  Algorithm algorithm = o.algorithm;
  if (algorithm == Algorithm::kAuto) algorithm = forced_algorithm_;
  if (algorithm == Algorithm::kAuto) {
    if (local_ != nullptr) {
      algorithm = Algorithm::kHierarchical;
    } else if (shm_ != nullptr) {
      algorithm = Algorithm::kDirect;
    } else {
      algorithm = bytes <= options_.small_message_bytes || o.count < static_cast<std::size_t>(size_)
                      ? Algorithm::kRecursiveDoubling
                      : Algorithm::kRing;
    }
  }
  NEURON_CHECK(algorithm != Algorithm::kDirect || shm_ != nullptr,
               "allreduce: the direct algorithm needs every rank on one host");
  NEURON_CHECK(algorithm != Algorithm::kHierarchical || local_ != nullptr,
               "allreduce: the hierarchical algorithm needs ranks on several hosts, several "
               "on one host at least (automatic transport)");
  NEURON_CHECK(algorithm != Algorithm::kBinomialTree && algorithm != Algorithm::kBruck,
               "allreduce: algorithm ", Name(algorithm), " does not implement it");
  h.algorithm = static_cast<std::uint8_t>(algorithm);  // all ranks must agree
  char* data = static_cast<char*>(o.data);
  const Label what = Describing(h);
  const bool small = algorithm == Algorithm::kDirect && size_ > 1 &&
                     bytes <= std::min(options_.small_message_bytes, WindowDataBytes());
  // Data that fits the windows is staged with the header: one phase fewer;
  // data that fits a header slot goes with the header itself.
  const bool staged = algorithm == Algorithm::kDirect && size_ > 1 && bytes <= WindowDataBytes();
  const bool in_slot = small && bytes <= detail::kInlineBytes;
  // Ranks with other options must not mix paths: the header says which.
  h.path = in_slot ? detail::kPathHeaderSlot : small ? detail::kPathStaged : detail::kPathAlgorithm;
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
      RingReduceScatter(data, EvenChunks(o.count), o.dtype, o.op, what);
      if (o.op == ReduceOp::kAvg) {
        const std::size_t begin = Begin(o.count, size_, rank_);
        const std::size_t esize = ElementSize(o.dtype);
        FinishAverage(o.dtype, data + begin * esize, Begin(o.count, size_, rank_ + 1) - begin,
                      static_cast<std::size_t>(size_));
      }
      RingAllGather(data, o.count, o.dtype, what);
      return;
    }
    case Algorithm::kRecursiveDoubling:
      RecursiveDoublingAllReduce(data, o.count, o.dtype, o.op, what);
      return;
    case Algorithm::kRabenseifner:
      RabenseifnerAllReduce(data, o.count, o.dtype, o.op, what);
      return;
    case Algorithm::kHierarchical:
      HierarchicalAllReduce(data, o.count, o.dtype, o.op);
      return;
    default:
      if (small) {
        SmallDirectAllReduce(data, o.count, o.dtype, o.op, in_slot);
        return;
      }
      bool none_registered = false;
      if (!RegisteredDirectAllReduce(data, o.count, o.dtype, o.op, what, &none_registered)) {
        // Staged by the handshake only if every rank staged.
        DirectAllReduce(data, o.count, o.dtype, o.op, what, staged && none_registered);
      }
      return;
  }
}

// The two levels of a multi-host group: a communicator per host (shared
// memory) and one of the hosts' leaders (their lowest rank; TCP). Only
// worth it when some host has several ranks.
void Communicator::BuildHierarchy(const std::vector<std::string>& hosts) {
  std::vector<std::string> distinct;
  std::vector<int> host_of(size_), count;
  for (int r = 0; r < size_; ++r) {
    auto it = std::find(distinct.begin(), distinct.end(), hosts[r]);
    host_of[r] = static_cast<int>(it - distinct.begin());
    if (it == distinct.end()) {
      distinct.push_back(hosts[r]);
      count.push_back(0);
    }
    ++count[host_of[r]];
  }
  if (*std::max_element(count.begin(), count.end()) < 2) return;
  host_of_ = host_of;
  host_ranks_.assign(distinct.size(), {});
  for (int r = 0; r < size_; ++r) host_ranks_[host_of[r]].push_back(r);
  const bool leader = std::find(host_of.begin(), host_of.end(), host_of[rank_]) -
                          host_of.begin() == rank_;
  // The levels keep clocks of their own: the fabric model accounts the
  // whole operation on this communicator's clock.
  CommunicatorOptions level = options_;
  level.clock = std::make_shared<runtime::SimClock>();
  // Both splits run flat (their allgathers must not take the hierarchy
  // that is being built).
  auto local = Split(host_of[rank_], rank_, level);
  auto leaders = Split(leader ? 0 : kNoColor, host_of[rank_], level);
  local_ = std::move(local);
  leaders_ = std::move(leaders);
  ResetStats();  // the splits' own allgathers are not the caller's
}

// Hierarchical allreduce (two-level, as NCCL's and Neuron's across nodes):
// reduce within each host to its leader (shared memory, rank order), then
// allreduce among the leaders (TCP), then broadcast within each host. The
// order is fixed, so every rank gets bitwise the same result; it differs
// from the flat order for floating point. Averages sum throughout and
// divide once by the group size.
void Communicator::HierarchicalAllReduce(void* data, std::size_t count, DataType dtype,
                                         ReduceOp op) {
  const ReduceOp stage = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  local_->Reduce({data, count, dtype, stage, 0});
  if (leaders_ != nullptr) {
    leaders_->AllReduce({data, count, dtype, stage});
    if (op == ReduceOp::kAvg) FinishAverage(dtype, data, count, static_cast<std::size_t>(size_));
  }
  local_->Broadcast({data, count, dtype, 0});
}

// Hierarchical broadcast: within the root's host from the root (shared
// memory), among the hosts' leaders from the root's host's (TCP, once per
// host rather than once per rank), then within every other host from its
// leader.
void Communicator::HierarchicalBroadcast(void* data, std::size_t count, DataType dtype,
                                         int root) {
  const int root_host = host_of_[root], my_host = host_of_[rank_];
  const auto& local = host_ranks_[root_host];
  if (my_host == root_host) {
    const int local_root = static_cast<int>(std::find(local.begin(), local.end(), root) -
                                            local.begin());
    local_->Broadcast({data, count, dtype, local_root});
  }
  if (leaders_ != nullptr) leaders_->Broadcast({data, count, dtype, root_host});
  if (my_host != root_host) local_->Broadcast({data, count, dtype, 0});
}

// Hierarchical allgather: within each host (shared memory), then the hosts'
// blocks among the leaders (TCP), then the whole from each leader within its
// host; the blocks are put in rank order at the end (hosts need not hold
// consecutive ranks).
void Communicator::HierarchicalAllGather(char* out, const void* in, std::size_t count,
                                         DataType dtype) {
  const std::size_t block = count * ElementSize(dtype);
  const auto& mine = host_ranks_[host_of_[rank_]];
  std::vector<char> host(mine.size() * block), all(size_ * block);
  local_->AllGather({in, host.data(), count, dtype});
  if (leaders_ != nullptr) {
    std::vector<std::size_t> counts;
    for (const auto& ranks : host_ranks_) counts.push_back(ranks.size() * count);
    leaders_->AllGatherV({host.data(), all.data(), counts, dtype});
  }
  local_->Broadcast({all.data(), count * size_, dtype, 0});
  std::size_t offset = 0;
  for (const auto& ranks : host_ranks_) {
    for (int r : ranks) {
      std::memcpy(out + r * block, all.data() + offset, block);
      offset += block;
    }
  }
}

std::vector<std::size_t> Communicator::EvenChunks(std::size_t count) const {
  std::vector<std::size_t> chunks(size_ + 1);
  for (int c = 0; c <= size_; ++c) chunks[c] = Begin(count, size_, c);
  return chunks;
}

// Ring reduce-scatter (Patarasuk & Yuan, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations", 2009): after n-1 steps rank r
// holds chunk r (elements [chunks[r], chunks[r+1])) reduced over all ranks,
// accumulated in ring order.
void Communicator::RingReduceScatter(char* data, const std::vector<std::size_t>& chunks,
                                     DataType dtype, ReduceOp op, const Label& what) {
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  std::size_t largest = 0;
  for (int c = 0; c < size_; ++c) largest = std::max(largest, chunks[c + 1] - chunks[c]);
  scratch_.resize(largest * esize);
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_chunk = Mod(rank_ - k - 1, size_);
    const int recv_chunk = Mod(rank_ - k - 2, size_);
    const std::size_t sb = chunks[send_chunk], rb = chunks[recv_chunk];
    const std::size_t rn = chunks[recv_chunk + 1] - rb;
    Exchange(right, data + sb * esize, (chunks[send_chunk + 1] - sb) * esize, left,
             scratch_.data(), rn * esize, what);
    Accumulate(dtype, op, data + rb * esize, scratch_.data(), rn);
  }
}

// Ring allgather: rank r starts owning chunk r; in n-1 steps each chunk
// travels once around the ring.
void Communicator::RingAllGather(char* data, std::size_t count, DataType dtype,
                                 const Label& what) {
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_chunk = Mod(rank_ - k, size_);
    const int recv_chunk = Mod(rank_ - k - 1, size_);
    const std::size_t sb = Begin(count, size_, send_chunk);
    const std::size_t rb = Begin(count, size_, recv_chunk);
    Exchange(right, data + sb * esize, (Begin(count, size_, send_chunk + 1) - sb) * esize,
             left, data + rb * esize, (Begin(count, size_, recv_chunk + 1) - rb) * esize,
             what);
  }
}

// Direct shared-memory reduction (the scheme of shared-memory allreduce in
// CPU collective libraries such as oneCCL and DeepSpeed's shm backend): per
// window-sized chunk, every rank stages its input in its shared window, then
// reduces its 1/n slice straight from every rank's window, in rank order,
// into its own window, then copies every rank's reduced slice out. Three
// phase flags order it; each element is reduced exactly once, over all ranks
// in rank order, so the result is the naive reference's, bitwise.
void Communicator::DirectAllReduce(char* data, std::size_t count, DataType dtype, ReduceOp op,
                                   const Label& what, bool staged) {
  const std::size_t esize = ElementSize(dtype);
  const std::size_t chunk = WindowDataBytes() / esize;
  std::vector<const void*> inputs(size_);
  for (std::size_t start = 0; start < count; start += chunk) {
    const std::size_t n = std::min(chunk, count - start);
    char* mine = data + start * esize;
    const std::uint64_t seq = window_sequence_ + 1;
    if (!staged) {  // else the handshake staged everything and all ranks saw it
      // The data areas are free once every rank collected their last use.
      shm_->WaitPhase(kCollectedPhase, window_sequence_, NewDeadline(), what);
      std::memcpy(WindowData(rank_), mine, n * esize);
      shm_->SyncPhase(kStagedPhase, seq, NewDeadline(), what);
    }
    window_sequence_ = seq;
    const std::size_t b = Begin(n, size_, rank_), e = Begin(n, size_, rank_ + 1);
    for (int r = 0; r < size_; ++r) inputs[r] = WindowData(r) + b * esize;
    if (e > b) {
      // Only this rank reads or writes slice `rank_` of its own window now.
      ReduceInputs(dtype, op, inputs.data(), inputs.size(), WindowData(rank_) + b * esize,
                   e - b, static_cast<std::size_t>(size_));
    }
    shm_->SyncPhase(kReducedPhase, seq, NewDeadline(), what);
    for (int r = 0; r < size_; ++r) {
      const std::size_t rb = Begin(n, size_, r), re = Begin(n, size_, r + 1);
      std::memcpy(mine + rb * esize, WindowData(r) + rb * esize, (re - rb) * esize);
    }
    shm_->PublishPhase(kCollectedPhase, seq);
  }
}

// Reduce-scatter by direct shared-memory reduction: each round every rank
// stages the next piece of every block in its window, then reduces the
// piece of its own block from all windows, in rank order (so the result
// equals the naive reference bitwise, as the direct allreduce's does).
void Communicator::DirectReduceScatter(const char* input, char* output,
                                       const std::vector<std::size_t>& chunks,
                                       DataType dtype, ReduceOp op, const Label& what) {
  const std::size_t esize = ElementSize(dtype);
  const std::size_t piece = std::max<std::size_t>(1, WindowDataBytes() / esize / size_);
  std::size_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max(longest, chunks[r + 1] - chunks[r]);
  std::vector<const void*> inputs(size_);
  auto length = [&](int block, std::size_t start) {
    const std::size_t count = chunks[block + 1] - chunks[block];
    return start < count ? std::min(piece, count - start) : 0;
  };
  for (std::size_t start = 0; start < longest; start += piece) {
    // The windows are free once every rank collected from them.
    shm_->WaitPhase(kCollectedPhase, window_sequence_, NewDeadline(), what);
    const std::uint64_t seq = ++window_sequence_;
    for (int b = 0; b < size_; ++b) {
      const std::size_t n = length(b, start);
      if (n > 0) {
        std::memcpy(WindowData(rank_) + b * piece * esize,
                    input + (chunks[b] + start) * esize, n * esize);
      }
    }
    shm_->SyncPhase(kStagedPhase, seq, NewDeadline(), what);
    const std::size_t n = length(rank_, start);
    if (n > 0) {
      for (int r = 0; r < size_; ++r) inputs[r] = WindowData(r) + rank_ * piece * esize;
      ReduceInputs(dtype, op, inputs.data(), inputs.size(), output + start * esize, n,
                   static_cast<std::size_t>(size_));
    }
    shm_->PublishPhase(kCollectedPhase, seq);
  }
}

// The small-message form of the direct reduction: the handshake already
// staged every rank's data, so each rank reduces the whole buffer from all
// windows (in rank order, like the naive reference) and is done.
void Communicator::SmallDirectAllReduce(char* data, std::size_t count, DataType dtype,
                                        ReduceOp op, bool in_slot) {
  window_inputs_.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    window_inputs_[static_cast<std::size_t>(r)] = in_slot ? InlineData(r) : WindowData(r);
  }
  ReduceInputs(dtype, op, window_inputs_.data(), window_inputs_.size(), data, count,
               static_cast<std::size_t>(size_));
  if (!in_slot) shm_->PublishPhase(kCollectedPhase, ++window_sequence_);
}

// The ranks beyond the largest power of two p of the power-of-two
// allreduces: rank p + i hands its data to rank i, which reduces it in
// (rank i's data first), and waits for the result. Returns p, or 0 on the
// ranks folded in (their data then holds the result).
int Communicator::FoldExtraRanks(char* data, std::size_t count, DataType dtype, ReduceOp op,
                                 const Label& what) {
  const std::size_t bytes = count * ElementSize(dtype);
  int p = 1;
  while (p * 2 <= size_) p *= 2;
  scratch_.resize(bytes);
  if (rank_ >= p) {
    transport_->Wait({transport_->Isend(rank_ - p, data, bytes)}, NewDeadline(), what);
    transport_->Wait({transport_->Irecv(rank_ - p, data, bytes)}, NewDeadline(), what);
    return 0;
  }
  if (rank_ < size_ - p) {
    transport_->Wait({transport_->Irecv(rank_ + p, scratch_.data(), bytes)}, NewDeadline(), what);
    Accumulate(dtype, op, data, scratch_.data(), count);
  }
  return p;
}

// After the power-of-two algorithm: rank i sends the result to rank p + i.
void Communicator::ServeExtraRanks(const char* data, std::size_t bytes, int p,
                                   const Label& what) {
  if (rank_ < size_ - p) {
    transport_->Wait({transport_->Isend(rank_ + p, data, bytes)}, NewDeadline(), what);
  }
}

// Recursive doubling (Thakur, Rabenseifner & Gropp, "Optimization of
// collective communication operations in MPICH", 2005), with the ranks
// beyond the largest power of two folded in first and served last. Each
// exchange combines the lower-ranked half first, so all ranks compute the
// same expression tree and get bitwise the same result.
void Communicator::RecursiveDoublingAllReduce(char* data, std::size_t count, DataType dtype,
                                              ReduceOp op, const Label& what) {
  const std::size_t bytes = count * ElementSize(dtype);
  const int p = FoldExtraRanks(data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank_ ^ d;
    Exchange(partner, data, bytes, partner, scratch_.data(), bytes, what);
    if (partner < rank_) {  // theirs op mine, computed in scratch
      Accumulate(dtype, op, scratch_.data(), data, count);
      std::memcpy(data, scratch_.data(), bytes);
    } else {
      Accumulate(dtype, op, data, scratch_.data(), count);
    }
  }
  if (op == ReduceOp::kAvg) FinishAverage(dtype, data, count, static_cast<std::size_t>(size_));
  ServeExtraRanks(data, bytes, p, what);
}

// Rabenseifner's allreduce (Rabenseifner, "Optimization of collective
// reduction operations", 2004; as in Thakur, Rabenseifner & Gropp 2005):
// recursive halving reduce-scatter, then recursive doubling allgather, over
// the largest power of two of ranks (the others folded in first and served
// last). Each exchange combines the lower-ranked side first.
void Communicator::RabenseifnerAllReduce(char* data, std::size_t count, DataType dtype,
                                         ReduceOp op, const Label& what) {
  const std::size_t esize = ElementSize(dtype), bytes = count * esize;
  const int p = FoldExtraRanks(data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  // Halving: keep the half on my side of the partner, reduce it, pass on the other.
  std::size_t lo = 0, hi = count;
  std::vector<std::pair<std::size_t, std::size_t>> kept;  // segment before each step
  for (int d = p / 2; d >= 1; d /= 2) {
    const int partner = rank_ ^ d;
    const std::size_t mid = lo + (hi - lo) / 2;
    const bool lower = (rank_ & d) == 0;
    const std::size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const std::size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    kept.emplace_back(lo, hi);
    Exchange(partner, data + give_lo * esize, (give_hi - give_lo) * esize, partner,
             scratch_.data(), (keep_hi - keep_lo) * esize, what);
    char* mine = data + keep_lo * esize;
    if (partner < rank_) {  // theirs op mine
      Accumulate(dtype, op, scratch_.data(), mine, keep_hi - keep_lo);
      std::memcpy(mine, scratch_.data(), (keep_hi - keep_lo) * esize);
    } else {
      Accumulate(dtype, op, mine, scratch_.data(), keep_hi - keep_lo);
    }
    lo = keep_lo;
    hi = keep_hi;
  }
  if (op == ReduceOp::kAvg && hi > lo) {
    FinishAverage(dtype, data + lo * esize, hi - lo, static_cast<std::size_t>(size_));
  }
  // Doubling: give my segment, take the partner's, in the reverse order.
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank_ ^ d;
    const auto [seg_lo, seg_hi] = kept.back();
    kept.pop_back();
    const std::size_t mid = seg_lo + (seg_hi - seg_lo) / 2;
    const bool lower = (rank_ & d) == 0;
    const std::size_t their_lo = lower ? mid : seg_lo, their_hi = lower ? seg_hi : mid;
    Exchange(partner, data + lo * esize, (hi - lo) * esize, partner, data + their_lo * esize,
             (their_hi - their_lo) * esize, what);
    lo = seg_lo;
    hi = seg_hi;
  }
  ServeExtraRanks(data, bytes, p, what);
}

// Bruck's allgather (Bruck et al., "Efficient algorithms for all-to-all
// communications in multiport message-passing systems", 1997): ceil(log2 n)
// steps; in step k rank r sends what it holds to r - 2^k and appends what
// r + 2^k holds; a final rotation puts the blocks in rank order.
void Communicator::BruckAllGather(char* out, const void* in, std::size_t block,
                                  const Label& what) {
  std::vector<char> held(block * size_);
  std::memcpy(held.data(), in, block);
  for (int k = 1; k < size_; k *= 2) {
    const int blocks = std::min(k, size_ - k);
    Exchange(Mod(rank_ - k, size_), held.data(), blocks * block, Mod(rank_ + k, size_),
             held.data() + k * block, blocks * block, what);
  }
  for (int i = 0; i < size_; ++i) {  // held[i] is rank r + i's block
    std::memcpy(out + Mod(rank_ + i, size_) * block, held.data() + i * block, block);
  }
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
    BruckAllGather(out, o.input, block, Describing(h));
    return;
  }
  if (out + rank_ * block != o.input) std::memmove(out + rank_ * block, o.input, block);
  if (size_ > 1) RingAllGather(out, o.count * size_, o.dtype, Describing(h));
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
  if (shm_ != nullptr && size_ > 1) {
    DirectReduceScatter(static_cast<const char*>(o.input), static_cast<char*>(o.output),
                        chunks, o.dtype, o.op, Describing(h));
    return;
  }
  std::vector<char> work(static_cast<const char*>(o.input),
                         static_cast<const char*>(o.input) + chunks.back() * esize);
  if (size_ > 1) RingReduceScatter(work.data(), chunks, o.dtype, o.op, Describing(h));
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
