// The process group's machinery: creation, the queue, point-to-point,
// barriers and statistics. The collectives are in collective_ops.cc.
#include "neuron/c10d/backend_neuron.h"

#include <algorithm>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "coalescing.h"
#include "neuron/c10d/job_store.h"
#include "neuron/c10d/shared_tensor_allocator.h"
#include "neuron/c10d/store_adapter.h"
#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"
#include "neuron_work.h"
#include "tensor_buffers.h"

namespace neuron::c10d {
namespace {

using collectives::Communicator;

// The job's secret for the transport when `store` is not the job's
// authenticated store (torchrun's TCPStore, a FileStore, a HashStore):
// $NEURON_JOB_SECRET, else $NEURON_RDZV_SECRET. Without one, a TCPStore
// (which anyone who reaches its port may read and write) gets a warning,
// once per process.
std::string TransportSecretFor(const c10::intrusive_ptr<::c10d::Store>& store) {
  auto base = store;
  while (auto* prefix = dynamic_cast<::c10d::PrefixStore*>(base.get())) {
    base = prefix->getUnderlyingStore();
  }
  if (dynamic_cast<JobStore*>(base.get()) != nullptr) return "";
  const auto& config = runtime::ConfigRegistry::Get();
  for (const auto key : {runtime::ConfigKey::kJobSecret, runtime::ConfigKey::kRdzvSecret}) {
    if (const auto secret = config.Find(key)) {
      collectives::auth::CheckSecret(*secret, "$" + std::string(runtime::VariableName(key)));
      return *secret;
    }
  }
  if (dynamic_cast<::c10d::TCPStore*>(base.get()) != nullptr) {
    TORCH_WARN_ONCE(
        "neuron backend: the process group's store is a TCPStore without authentication "
        "(as torchrun starts it): whoever reaches its port can read the ranks' addresses and "
        "the transport's connection token and write keys, as with Gloo under torchrun. Set "
        "NEURON_JOB_SECRET (16 or more bytes, the same on every rank) to derive the token "
        "from it instead, or start the job with neuronrun, whose store is authenticated.");
  }
  return "";
}

collectives::CommunicatorOptions CommunicatorOptionsFor(
    const BackendNeuronOptions& o, const c10::intrusive_ptr<::c10d::Store>& store) {
  collectives::CommunicatorOptions options;
  options.timeout = o.timeout;
  options.global_ranks.assign(o.global_ranks.begin(), o.global_ranks.end());
  options.clock = o.clock;
  options.transport_secret = TransportSecretFor(store);
  return options;
}

}  // namespace

void RethrowWithContext(const std::string& context) {
  try {
    throw;
  } catch (const InvalidUsage& e) {
    throw InvalidUsage(context + ": " + e.what());
  } catch (const TimeoutError& e) {
    // "Timed out" as torch's own backends say it: code matches on it.
    const std::string what = e.what();
    // torch's tests match " (Timed out|closed|timeout) ".
    const bool said = what.find(" Timed out ") != std::string::npos;
    throw TimeoutError(context + (said ? ": " + what : ": Timed out (" + what + ")"));
  } catch (const IoError& e) {
    throw IoError(context + ": " + e.what());
  } catch (const RemoteError& e) {
    throw RemoteError(context + ": " + e.what());
  } catch (const c10::Error& e) {
    throw Error(context + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error(context + ": " + e.what());
  }
}

BackendNeuron::BackendNeuron(const Ptr<::c10d::Store>& store, int rank,
                                       int size, BackendNeuronOptions options)
    : ::c10d::Backend(rank, size),
      options_(std::move(options)),
      prefix_(std::make_shared<const std::string>(
          StrCat("neuron rank ", rank, " (group ",
                 options_.group_name.empty() ? std::string("?") : options_.group_name,
                 ", size ", size, "): "))),
      store_(store),
      timeout_ms_(options_.timeout.count()),
      coalescing_(std::make_unique<Coalescing>()) {
  NEURON_CHECK(store_, "neuron process group: the store is null");
  NEURON_CHECK(options_.timeout.count() > 0, *prefix_, "the timeout must be positive, got ",
               options_.timeout.count(), " ms");
  NEURON_CHECK(options_.global_ranks.empty() ||
                   options_.global_ranks.size() == static_cast<std::size_t>(size),
               "neuron process group: ", options_.global_ranks.size(),
               " global ranks for a group of ", size);
  try {
    if (runtime::ConfigRegistry::Get().GetInt(runtime::ConfigKey::kSharedTensors) != 0) {
      InstallSharedTensorAllocator();
    }
    auto communicator =
        std::make_unique<Communicator>(std::make_shared<C10dStore>(store_), rank, size,
                                       CommunicatorOptionsFor(options_, store_));
    transport_name_ = communicator->transport_name();
    async_ = std::make_unique<collectives::AsyncCommunicator>(std::move(communicator));
  } catch (...) {
    RethrowWithContext(*prefix_ + "creating the process group");
  }
  init();
}

BackendNeuron::~BackendNeuron() = default;

std::string BackendNeuron::Context(const char* name, std::uint64_t sequence) const {
  return StrCat(*prefix_, name, " #", sequence);
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::Enqueue(
    ::c10d::OpType type, const char* name, Body body, Tensors outputs,
    std::chrono::milliseconds timeout, bool point_to_point, std::shared_ptr<int> source_rank) {
  if (timeout == ::c10d::kUnsetTimeout) timeout = DefaultTimeout();
  // Compute queued before the call (adaptive eager's region) is charged
  // before the collective takes its issue time from the clock.
  runtime::SettlePendingCompute("collective");
  // Refused before it takes a sequence number: the next call is in step.
  NEURON_CHECK(timeout.count() > 0,
               Context(name, point_to_point ? p2p_sequence_ : sequence_),
               ": the timeout must be positive, got ", timeout.count(), " ms");
  const std::uint64_t sequence = point_to_point ? p2p_sequence_++ : sequence_++;
  auto work = c10::make_intrusive<NeuronWork>(rank_, type, name, std::move(outputs),
                                              std::move(source_rank));
  // The context of an error is formatted only when there is one.
  auto wrapped = [body = std::move(body), prefix = prefix_, name, sequence, timeout,
                  point_to_point](Communicator& c) {
    try {
      // Each lane's thread sets its own: collectives and messages may run
      // at once.
      if (point_to_point) {
        c.set_message_timeout(timeout);
      } else {
        c.set_operation_timeout(timeout);
      }
      body(c);
    } catch (...) {
      RethrowWithContext(StrCat(*prefix, name, " #", sequence));
    }
  };
  using Lane = collectives::AsyncCommunicator::Lane;
  std::lock_guard<std::mutex> lock(lanes_mutex_);
  NEURON_CHECK(async_ != nullptr, *prefix_, name, ": the backend was shut down");
  work->Attach(async_->Enqueue(
      std::move(wrapped), std::string(name) + " #" + std::to_string(sequence),
      point_to_point ? Lane::kPointToPoint : Lane::kCollectives));
  return work;
}

void BackendNeuron::RunLocal(const Body& body) {
  std::shared_ptr<collectives::Work> work;
  {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    NEURON_CHECK(async_ != nullptr, *prefix_, "statistics: the backend was shut down");
    work = async_->Enqueue(body, "statistics");
  }
  work->Wait();
}

c10::intrusive_ptr<::c10d::Backend::Options> BackendNeuron::getBackendOptions() {
  auto options = c10::make_intrusive<::c10d::Backend::Options>("neuron", DefaultTimeout());
  options->group_name = options_.group_name;
  for (int r = 0; r < size_; ++r) {
    options->global_ranks_in_group.push_back(static_cast<std::uint64_t>(
        options_.global_ranks.empty() ? r : options_.global_ranks[r]));
  }
  return options;
}

c10::intrusive_ptr<::c10d::Backend> BackendNeuron::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<::c10d::Backend::Options>& opts) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  BackendNeuronOptions options;
  options.timeout = opts ? opts->timeout : DefaultTimeout();
  options.group_name = opts && !opts->group_name.empty() ? opts->group_name
                                                         : options_.group_name + ":split";
  options.clock = options_.clock;
  for (int r : ranks) {
    NEURON_CHECK(r >= 0 && r < size_, *prefix_, "split: rank ", r,
                 " is not a member of this group of ", size_);
    options.global_ranks.push_back(options_.global_ranks.empty() ? r : options_.global_ranks[r]);
  }
  // torch may hand every new group the same store and name: the keys of this
  // one must not meet those of the groups the other members split into, nor
  // of an earlier split into the same members.
  std::string prefix = StrCat("neuron-split/", splits_++, "/");
  for (std::int64_t r : options.global_ranks) prefix += StrCat(r, ",");
  auto own_store = c10::make_intrusive<::c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<BackendNeuron>(own_store, static_cast<int>(me - ranks.begin()),
                                            static_cast<int>(ranks.size()), std::move(options));
}

void BackendNeuron::setTimeout(std::chrono::milliseconds timeout) {
  NEURON_CHECK(timeout.count() > 0, *prefix_, "setTimeout: the timeout must be positive, got ",
               timeout.count(), " ms");
  timeout_ms_.store(timeout.count());
}

std::chrono::milliseconds BackendNeuron::DefaultTimeout() const {
  return std::chrono::milliseconds(timeout_ms_.load());
}

void BackendNeuron::shutdown() {
  std::unique_ptr<collectives::AsyncCommunicator> lanes;
  {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    lanes.swap(async_);
  }
  lanes.reset();  // runs what is queued, joins the progress threads
}

void BackendNeuron::abort() {
  {
    std::lock_guard<std::mutex> lock(lanes_mutex_);
    if (async_) async_->Abort(*prefix_ + "aborted by this rank");
  }
  shutdown();
}

// --- point-to-point ---------------------------------------------------------

namespace {

// A peer of the group; this rank itself only inside a coalescing window
// (batch_isend_irecv), where its receive is in the same batch (as NCCL takes
// a send to itself in a group; alone, it would wait for itself).
void CheckPeer(int peer, int rank, int size, const char* op, bool coalescing) {
  NEURON_CHECK(peer >= 0 && peer < size, op, ": peer rank ", peer,
               " is not a rank of the group (0..", size - 1, ", this is rank ", rank, ")");
  NEURON_CHECK(peer != rank || coalescing, op, ": peer rank ", peer,
               " is this rank: a message to itself is taken only in batch_isend_irecv, "
               "with its receive in the same batch");
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> BackendNeuron::send(Tensors& tensors, int dst_rank,
                                                          int tag) {
  return Checked(
      "send",
      [&]() -> c10::intrusive_ptr<::c10d::Work> {
        CheckSingle(tensors, "send");
        const bool coalescing = CoalescingActive();
        CheckPeer(dst_rank, rank_, size_, "send", coalescing);
        if (coalescing) return Hold(true, tensors[0], dst_rank, tag);
        at::Tensor input = tensors[0].contiguous();
        auto body = [input, dst_rank, tag](Communicator& c) {
          c.Send(dst_rank, input.data_ptr(), Bytes(input),
                 static_cast<std::uint64_t>(tag));
        };
        return Enqueue(::c10d::OpType::SEND, "send", std::move(body), {},
                       ::c10d::kUnsetTimeout, true);
      },
      true);
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::recv(Tensors& tensors, int src_rank,
                                                          int tag) {
  return Checked(
      "recv",
      [&]() -> c10::intrusive_ptr<::c10d::Work> {
        const bool coalescing = CoalescingActive();
        CheckPeer(src_rank, rank_, size_, "recv", coalescing);
        if (coalescing) {
          CheckSingle(tensors, "recv");
          return Hold(false, tensors[0], src_rank, tag);
        }
        return Receive(tensors, src_rank, tag);
      },
      true);
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::recvAnysource(Tensors& tensors,
                                                                   int tag) {
  return Checked(
      "recvAnysource",
      [&]() -> c10::intrusive_ptr<::c10d::Work> {
        return Receive(tensors, Communicator::kAnySource, tag);
      },
      true);
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::Receive(Tensors& tensors,
                                                             int src_rank, int tag) {
  CheckSingle(tensors, "recv");
  Output output(tensors[0]);
  auto source = std::make_shared<int>(-1);  // the sender, for recvAnysource
  auto body = [output, src_rank, tag, source](Communicator& c) {
    *source = c.Recv(src_rank, output.data(), Bytes(output.buffer()),
                     static_cast<std::uint64_t>(tag));
    output.CopyBack();
  };
  const auto type = src_rank == Communicator::kAnySource ? ::c10d::OpType::RECVANYSOURCE
                                                         : ::c10d::OpType::RECV;
  return Enqueue(type, "recv", std::move(body), tensors, ::c10d::kUnsetTimeout, true, source);
}

// --- barriers -----------------------------------------------------------------

c10::intrusive_ptr<::c10d::Work> BackendNeuron::barrier(
    const ::c10d::BarrierOptions& opts) {
  return Checked("barrier", [&]() -> c10::intrusive_ptr<::c10d::Work> {
    return Enqueue(::c10d::OpType::BARRIER, "barrier",
                   [](Communicator& c) { c.Barrier(); }, {}, opts.timeout);
  });
}

void BackendNeuron::monitoredBarrier(const ::c10d::BarrierOptions& opts,
                                          bool wait_all_ranks) {
  const std::uint64_t n = monitored_barriers_++;
  const auto timeout =
      opts.timeout == ::c10d::kUnsetTimeout ? DefaultTimeout() : opts.timeout;
  const std::string context = Context("monitoredBarrier", n);
  auto key = [](std::uint64_t barrier, int rank) {
    return StrCat("monitored_barrier/", barrier, "/", rank);
  };
  C10dStore store(store_);
  try {
    store.Set(key(n, rank_), "1");
    // Everyone has passed barrier n-2 once this rank got past n-1.
    if (n >= 2) store.Delete(key(n - 2, rank_));
    // No time to wait at all (Gloo's words again).
    NEURON_CHECK(timeout.count() > 0, "Rank ", rank_, " timed out in monitoredBarrier after ",
                 timeout.count(), " ms");
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(key(n, r));
    store.Wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!store.Check({key(n, r)})) missing.push_back(r);
    }
    if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    // Gloo's words ("Rank 1 failed to pass monitoredBarrier in 100 ms"):
    // code written against Gloo matches them.
    throw TimeoutError(StrCat(context, ": Rank", missing.size() == 1 ? " " : "s ", ranks,
                              " failed to pass monitoredBarrier in ", timeout.count(),
                              " ms"));
  } catch (...) {
    RethrowWithContext(context);
  }
}

// --- statistics ---------------------------------------------------------------

std::vector<collectives::OpRecord> BackendNeuron::Records() {
  std::vector<collectives::OpRecord> records;
  RunLocal([&](Communicator& c) { records.assign(c.records().begin(), c.records().end()); });
  return records;
}

collectives::CommunicatorTotals BackendNeuron::Totals() {
  collectives::CommunicatorTotals totals;
  RunLocal([&](Communicator& c) { totals = c.totals(); });
  return totals;
}

void BackendNeuron::ResetStats() {
  RunLocal([](Communicator& c) { c.ResetStats(); });
}

void BackendNeuron::WriteChromeTrace(const std::string& path) {
  RunLocal([&](Communicator& c) { c.WriteChromeTrace(path); });
}

c10::intrusive_ptr<BackendNeuron> CreateBackendNeuron(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, std::vector<std::int64_t> global_ranks,
    std::string group_name, std::shared_ptr<runtime::SimClock> clock) {
  BackendNeuronOptions options;
  // A process group torch.distributed creates belongs to this process's rank:
  // its clock, which compiled graphs and pipeline stages advance too.
  options.clock = clock ? std::move(clock) : runtime::ProcessClock();
  options.timeout = timeout;
  options.global_ranks = std::move(global_ranks);
  options.group_name = std::move(group_name);
  return c10::make_intrusive<BackendNeuron>(store, rank, size, std::move(options));
}

c10::intrusive_ptr<::c10d::ProcessGroup> MakeProcessGroup(
    const c10::intrusive_ptr<::c10d::Store>& store, c10::intrusive_ptr<BackendNeuron> backend) {
  NEURON_CHECK(backend, "MakeProcessGroup: the backend is null");
  auto pg = c10::make_intrusive<::c10d::ProcessGroup>(store, backend->getRank(),
                                                       backend->getSize());
  using Type = ::c10d::ProcessGroup::BackendType;
  pg->setBackend(c10::DeviceType::CPU, Type::CUSTOM, backend);
  pg->setBackend(c10::DeviceType::PrivateUse1, Type::CUSTOM, backend);  // "neuron" tensors
  pg->setDefaultBackend(Type::CUSTOM);
  return pg;
}

}  // namespace neuron::c10d
