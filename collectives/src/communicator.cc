#include "neuron/collectives/communicator.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "algorithms.h"
#include "communicator_internal.h"
#include "handshake.h"
#include "hierarchy.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/collectives/transport/shm_transport.h"
#include "neuron/collectives/transport/tcp_transport.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "op_accounting.h"

namespace neuron::collectives {

using detail::OpCode;

namespace {

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


Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size,
                           CommunicatorOptions options)
    : GroupContext(rank, size, options.timeout),
      store_(std::move(store)),
      tuner_(options.small_message_bytes),
      transport_secret_(options.transport_secret) {
  NEURON_CHECK(size >= 1, "communicator size must be >= 1, got ", size);
  NEURON_CHECK(rank >= 0 && rank < size, "communicator rank ", rank, " outside 0..", size - 1);
  accounting_ = std::make_unique<detail::OpAccounting>(
      detail::AccountingOptions{options.clock, options.fabric, options.global_ranks,
                                options.max_records},
      rank, size);
  handshake_ = std::make_unique<detail::Handshake>(static_cast<GroupContext&>(*this));
  // Made now, in the thread that creates the group, not first in a progress
  // thread while another thread may fork (its fork handlers: shared_buffers.h).
  transport::SharedBufferPool::Instance();
  Connect(options);
}

void Communicator::Connect(const CommunicatorOptions& options) {
  const std::string me = HostIdentity(options.host);
  store_->Set("host/" + std::to_string(rank_), me);
  std::vector<std::string> hosts(size_);
  bool one_host = true;
  for (int p = 0; p < size_; ++p) {
    hosts[p] = store_->Get("host/" + std::to_string(p), options.timeout);
    one_host = one_host && hosts[p] == me;
  }
  NEURON_CHECK(one_host || options.transport != TransportKind::kShm,
               "communicator: shared memory was asked for, but the ranks span hosts");
  if (options.transport == TransportKind::kTcp || !one_host) {
    transport::TcpOptions tcp;
    tcp.address = options.tcp_address;
    tcp.loopback = one_host;
    tcp.setup_timeout = options.timeout;
    tcp.secret = options.transport_secret;
    transport_ = std::make_unique<transport::TcpTransport>(*store_, rank_, size_, tcp);
    StartPointToPoint(false, options);
    if (!one_host && options.transport == TransportKind::kAuto) {
      hierarchy_ = detail::Hierarchy::Build(*this, hosts, options);
    }
    return;
  }
  transport::ShmOptions shm;
  shm.ring_bytes = options.shm_ring_bytes;
  shm.window_bytes =
      WindowBytesFor(options.shm_window_bytes, size_) + detail::kWindowDataOffset;
  shm.setup_timeout = options.timeout;
  shm.global_ranks = options.global_ranks;
  transport_ = std::make_unique<transport::ShmTransport>(*store_, rank_, size_, shm);
  windows_ = transport_->windows();
  StartPointToPoint(true, options);
}

detail::Header Communicator::NewHeader(OpCode op, DataType dtype, std::uint64_t count,
                                       ReduceOp reduce, int root) const {
  return handshake_->Next(op, dtype, count, reduce, root);
}

detail::Agreed Communicator::Handshake(detail::Header& mine, const void* staged,
                                       std::size_t staged_bytes, const void* slot_data,
                                       std::size_t slot_bytes) {
  registered_op_ = false;
  return handshake_->Run(mine, accounting_->Arrival(), staged, staged_bytes, slot_data,
                         slot_bytes);
}

void Communicator::CheckRoot(int root, const char* op) const {
  NEURON_CHECK(root >= 0 && root < size_, op, ": root ", root, " outside 0..", size_ - 1);
}

std::uint64_t Communicator::sequence() const { return handshake_->sequence(); }
const RecordLog& Communicator::records() const { return accounting_->records(); }
CommunicatorTotals Communicator::totals() const { return accounting_->totals(); }
void Communicator::ResetStats() { accounting_->ResetStats(); }
void Communicator::WriteChromeTrace(const std::string& path) const {
  accounting_->WriteChromeTrace(path);
}
runtime::SimClock& Communicator::clock() { return *accounting_->clock(); }
void Communicator::set_join_compute(bool join) { accounting_->set_join_compute(join); }
const runtime::FabricModel& Communicator::fabric() const {
  return *accounting_->fabric();
}

void Communicator::Abort(const std::string& reason) {
  transport_->Abort(reason);
  if (hierarchy_ != nullptr) hierarchy_->Abort(reason);
  AbortPointToPoint(reason);
}

void Communicator::Broadcast(const BroadcastOptions& o) {
  CheckRoot(o.root, "broadcast");
  NEURON_CHECK(o.data != nullptr || o.count == 0, "broadcast: data is null");
  detail::Header h =
      NewHeader(OpCode::kBroadcast, o.dtype, o.count, ReduceOp::kSum, o.root);
  const std::size_t bytes = o.count * ElementSize(o.dtype);
  h.model_bytes = static_cast<double>(bytes);
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  if (size_ == 1 || bytes == 0) return;
  if (hierarchy_ != nullptr) {
    hierarchy_->Broadcast(o.data, o.count, o.dtype, o.root);
    return;
  }
  BinomialBroadcast(*this, o.data, bytes, o.root, detail::Handshake::Describing(h));
}

void Communicator::AllGather(const AllGatherOptions& o) {
  NEURON_CHECK((o.input != nullptr && o.output != nullptr) || o.count == 0,
               "allgather: input or output is null");
  detail::Header h = NewHeader(OpCode::kAllGather, o.dtype, o.count);
  const std::size_t block = o.count * ElementSize(o.dtype);
  h.model_bytes = static_cast<double>(block * size_);
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  char* out = static_cast<char*>(o.output);
  if (block == 0) return;
  const Label what = detail::Handshake::Describing(h);
  switch (tuner_.AllGather(o.algorithm, block, shape())) {
    case Algorithm::kHierarchical:
      hierarchy_->AllGather(out, o.input, o.count, o.dtype);
      return;
    case Algorithm::kBruck:
      if (size_ > 1) {
        BruckAllGather(*this, out, o.input, block, what);
        return;
      }
      [[fallthrough]];
    default:
      if (out + rank_ * block != o.input)
        std::memmove(out + rank_ * block, o.input, block);
      if (size_ > 1) RingAllGather(*this, out, o.count * size_, o.dtype, what);
  }
}

void Communicator::ReduceScatter(const ReduceScatterOptions& o) {
  CheckReducible(o.dtype, o.op, "reducescatter");
  const bool uneven = !o.counts.empty();
  NEURON_CHECK(!uneven || o.counts.size() == static_cast<std::size_t>(size_),
               "reducescatter: counts needs one entry per rank (", size_, "), got ",
               o.counts.size());
  std::vector<std::size_t> chunks(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) chunks[r + 1] = chunks[r] + (uneven ? o.counts[r] : o.count);
  const std::size_t mine = chunks[rank_ + 1] - chunks[rank_];
  NEURON_CHECK((o.input != nullptr || chunks.back() == 0) && (o.output != nullptr || mine == 0),
               "reducescatter: input or output is null");
  // The whole input's size: equal calls have equal totals.
  detail::Header h = NewHeader(OpCode::kReduceScatter, o.dtype, chunks.back(), o.op);
  h.fingerprint = Fingerprint(o.counts);
  h.model_bytes = static_cast<double>(chunks.back() * ElementSize(o.dtype));
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  if (chunks.back() == 0) return;
  const auto* input = static_cast<const char*>(o.input);
  auto* output = static_cast<char*>(o.output);
  const Label what = detail::Handshake::Describing(h);
  if (windows_ != nullptr && size_ > 1) {
    DirectReduceScatter(*this, input, output, chunks, o.dtype, o.op, what);
  } else {
    RingReduceScatterInto(*this, input, output, chunks, o.dtype, o.op, what);
  }
}

void Communicator::Barrier() {
  detail::Header h = NewHeader(OpCode::kBarrier, DataType::kFloat32, 0);
  h.model_bytes = 0;
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  DisseminationBarrier(*this, detail::Handshake::Describing(h));
}

}  // namespace neuron::collectives
