// The "neuron" backend of torch.distributed: a c10d::Backend over the
// collectives library's communicator.
//
// Usage (C++; from Python, `import torchneuron` registers the backend and
// `dist.init_process_group("neuron")` creates one):
//   auto store = c10::make_intrusive<c10d::FileStore>(path, size);
//   auto backend = c10::make_intrusive<neuron::c10d::BackendNeuron>(store, rank, size);
//   std::vector<at::Tensor> tensors = {at::ones({8})};
//   backend->allreduce(tensors)->wait();
//   // A c10d::ProcessGroup over it (what libtorch code passes around):
//   auto pg = neuron::c10d::MakeProcessGroup(store, backend);
//
// Each group owns one communicator (shared memory between ranks on this
// host, TCP otherwise) driven by two progress threads: collectives run in
// issue order on one, send/recv in issue order on the other, so a pending
// receive never blocks a collective. Every call validates its tensors at
// once (CPU, strided, supported dtype and reduce op, consistent sizes) and
// throws InvalidUsage naming the op and dtype; failures while running reach
// the work (wait() rethrows, the future carries the error) with the rank, the
// op and the group's sequence number in the message. Non-contiguous tensors
// are staged through contiguous copies. Reductions are deterministic (rank
// order, see collectives/communicator.h).
//
// Thread-safety: as c10d requires, calls may come from any thread; ops are
// ordered by the order of the calls.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "neuron/collectives/op_stats.h"

namespace neuron::collectives {
class AsyncCommunicator;
class Communicator;
}  // namespace neuron::collectives

namespace neuron::runtime {
class SimClock;
}  // namespace neuron::runtime

namespace neuron::c10d {

// Rethrows the exception being handled with `context` in front of its
// message, keeping its neuron error type (so Python sees the same class); a
// TimeoutError's message says "Timed out", as torch's backends' do.
[[noreturn]] void RethrowWithContext(const std::string& context);

struct BackendNeuronOptions {
  // Every wait of every operation; torch's init_process_group(timeout=).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // The job ranks of the members in group-rank order (empty: 0..size-1);
  // they place the members on the simulated fabric.
  std::vector<std::int64_t> global_ranks;
  // For messages ("default_pg", torch's group names).
  std::string group_name;
  // This rank's simulated clock (null: one of the group's own). The Python
  // package passes runtime::ProcessClock(), which compiled graphs advance.
  std::shared_ptr<runtime::SimClock> clock;
};

class BackendNeuron : public ::c10d::Backend {
 public:
  using Work = ::c10d::Work;
  template <typename T>
  using Ptr = c10::intrusive_ptr<T>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;

  // Collective over the group: every member calls it with the same store.
  BackendNeuron(const Ptr<::c10d::Store>& store, int rank, int size,
                     BackendNeuronOptions options = {});
  ~BackendNeuron() override;

  const std::string getBackendName() const override { return "neuron"; }

  Ptr<Work> broadcast(Tensors& tensors, const ::c10d::BroadcastOptions& opts) override;
  Ptr<Work> allreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts) override;
  Ptr<Work> allreduce_coalesced(Tensors& tensors,
                                const ::c10d::AllreduceCoalescedOptions& opts) override;
  Ptr<Work> reduce(Tensors& tensors, const ::c10d::ReduceOptions& opts) override;
  Ptr<Work> allgather(TensorLists& outputs, Tensors& inputs,
                      const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                            const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                const ::c10d::AllgatherOptions& opts) override;
  // One _allgather_base per (output, input) pair, as one operation.
  Ptr<Work> allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                            const ::c10d::AllgatherOptions& opts) override;
  Ptr<Work> gather(TensorLists& outputs, Tensors& inputs,
                   const ::c10d::GatherOptions& opts) override;
  Ptr<Work> scatter(Tensors& outputs, TensorLists& inputs,
                    const ::c10d::ScatterOptions& opts) override;
  Ptr<Work> reduce_scatter(Tensors& outputs, TensorLists& inputs,
                           const ::c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                 const ::c10d::ReduceScatterOptions& opts) override;
  // One _reduce_scatter_base per (output, input) pair, as one operation.
  Ptr<Work> reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                            const ::c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                          std::vector<int64_t>& output_split_sizes,
                          std::vector<int64_t>& input_split_sizes,
                          const ::c10d::AllToAllOptions& opts) override;
  Ptr<Work> alltoall(Tensors& outputs, Tensors& inputs,
                     const ::c10d::AllToAllOptions& opts) override;
  Ptr<Work> send(Tensors& tensors, int dst_rank, int tag) override;
  Ptr<Work> recv(Tensors& tensors, int src_rank, int tag) override;
  Ptr<Work> recvAnysource(Tensors& tensors, int tag) override;
  Ptr<Work> barrier(const ::c10d::BarrierOptions& opts) override;
  // Coalescing (batch_isend_irecv, _coalescing_manager): send and recv in
  // the window are held and run as one operation at endCoalescing, every
  // send before every receive, so the order the ranks list them in cannot
  // deadlock; endCoalescing's work completes after everything in the window.
  bool supportsCoalescing() const override { return true; }
  // shutdown: runs what is queued, then stops the progress threads (the
  // other members are not told). abort: fails the running and queued
  // operations on every member, then stops. Both are final: a later
  // operation throws InvalidUsage. Call without holding the GIL.
  void shutdown() override;
  void abort() override;
  // The timeout of the operations issued from now on that set none of
  // their own (init_process_group's until then).
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  Ptr<Work> endCoalescing() override;
  // Every rank reports to the store; waits until all did or the timeout
  // passes, then throws naming the ranks that did not arrive (the first
  // one, or all of them with `wait_all_ranks`), as Gloo's does.
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // Collectives issued on this group; equal on every member (groups start
  // at 0 together, so setting is a no-op).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_.load(); }

  // Two-clock statistics of the completed collectives (they wait for the
  // operations issued before them; local, not collective).
  std::vector<collectives::OpRecord> Records();
  collectives::CommunicatorTotals Totals();
  void ResetStats();
  void WriteChromeTrace(const std::string& path);

  // Splitting (torch.distributed.split_group): a new group of the members
  // `ranks` (ranks of this group, sorted) over `store`, this rank's clock
  // shared; every member calls it, the others get no backend.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<::c10d::Backend> split(
      const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<::c10d::Backend::Options>& opts) override;
  // "shm" or "tcp".
  std::string TransportName() const { return transport_name_; }
  const std::string& group_name() const { return options_.group_name; }

 private:
  using Body = std::function<void(collectives::Communicator&)>;
  // Validates and stages one all-gather / reduce-scatter of a whole tensor;
  // the body runs it on the lane and copies the result back.
  Body AllGatherBaseBody(at::Tensor& output, at::Tensor& input, const char* name);
  Body ReduceScatterBaseBody(at::Tensor& output, at::Tensor& input,
                             const ::c10d::ReduceOp& reduce_op, const char* name);
  // Throws InvalidUsage unless there are as many outputs as inputs.
  static void CheckPairs(const char* name, std::size_t outputs, std::size_t inputs);
  // The *_coalesced forms: `make(output, input)` for every pair, run one
  // after the other as one operation.
  template <typename Make>
  Body Pairwise(const char* name, Tensors& outputs, Tensors& inputs, Make&& make) {
    CheckPairs(name, outputs.size(), inputs.size());
    std::vector<Body> bodies;
    for (std::size_t i = 0; i < inputs.size(); ++i) bodies.push_back(make(outputs[i], inputs[i]));
    return [bodies = std::move(bodies)](collectives::Communicator& c) {
      for (const auto& body : bodies) body(c);
    };
  }
  // Runs `issue` (validate, then Enqueue); an error it throws gets the
  // context of the operation it would have been.
  template <typename F>
  Ptr<Work> Checked(const char* name, F&& issue, bool point_to_point = false) {
    try {
      return issue();
    } catch (...) {
      RethrowWithContext(
          Context(name, (point_to_point ? p2p_sequence_ : sequence_).load()));
    }
  }
  // Queues `body` on the collectives (or point-to-point) lane; the returned
  // work completes with `outputs` once it ran. `timeout` (the c10d call's
  // options; kUnsetTimeout: the group's) bounds every wait of the operation.
  Ptr<Work> Enqueue(::c10d::OpType type, const char* name, Body body, Tensors outputs,
                    std::chrono::milliseconds timeout, bool point_to_point = false,
                    std::shared_ptr<int> source_rank = nullptr);
  // The context of an error: "neuron rank R (group G, size S): <op> #<seq>".
  std::string Context(const char* name, std::uint64_t sequence) const;
  // recv and recvAnysource (src_rank kAnySource): one receive on the
  // point-to-point lane into tensors[0].
  Ptr<Work> Receive(Tensors& tensors, int src_rank, int tag);
  // Runs a local function on the collectives lane after what is queued.
  void RunLocal(const Body& body);
  // Coalescing (coalescing.cc): the window's state, whether it is open, and
  // holding a send or recv issued in it.
  struct Coalescing;
  Coalescing& coalescing();
  bool CoalescingActive();
  Ptr<Work> Hold(bool send, at::Tensor& tensor, int peer, int tag);
  // allreduce of a sparse COO tensor (sparse_allreduce.cc).
  Ptr<Work> SparseAllreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts);

  BackendNeuronOptions options_;
  // "neuron rank R (group G, size S): ", the start of every error.
  std::shared_ptr<const std::string> prefix_;
  Ptr<::c10d::Store> store_;
  // The progress lanes; null once shut down. Guarded by lanes_mutex_ where
  // shutdown may race an operation's issue.
  std::mutex lanes_mutex_;
  std::unique_ptr<collectives::AsyncCommunicator> async_;
  std::string transport_name_;
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<std::uint64_t> p2p_sequence_{0};
  std::atomic<std::uint64_t> monitored_barriers_{0};
  std::atomic<std::uint64_t> splits_{0};
  std::atomic<std::int64_t> timeout_ms_;  // see setTimeout
  std::chrono::milliseconds DefaultTimeout() const;
  std::unique_ptr<Coalescing> coalescing_;
};

// The creator torch.distributed calls (Backend.register_backend with
// extended_api=True hands over these fields). `clock` null: the process's
// (runtime::ProcessClock(), shared by every group the process creates).
c10::intrusive_ptr<BackendNeuron> CreateBackendNeuron(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, std::vector<std::int64_t> global_ranks,
    std::string group_name, std::shared_ptr<runtime::SimClock> clock = nullptr);

// A c10d::ProcessGroup whose backend for CPU and "neuron" tensors is `backend` (what
// torch.distributed makes for init_process_group("neuron")): c10d's
// dispatched ops (ProcessGroup::allreduce, ...) reach the backend.
c10::intrusive_ptr<::c10d::ProcessGroup> MakeProcessGroup(
    const c10::intrusive_ptr<::c10d::Store>& store, c10::intrusive_ptr<BackendNeuron> backend);

}  // namespace neuron::c10d
