// Coalescing (startCoalescing .. endCoalescing): what batch_isend_irecv and
// _coalescing_manager use. Point-to-point operations issued in the window
// are held and run as one operation at endCoalescing, every send before
// every receive. A send to this rank itself is a copy into the receive from
// itself with the same tag in the batch (in order; as NCCL does in a group:
// PyTorch's pipeline schedules send to a stage on the same rank this way);
// one without its other half is refused at endCoalescing. Sends are
// buffered (up to Communicator::kMaxBufferedBytes), so two ranks that each
// list "receive, then send" do not wait on each other as they would on one
// in-order lane. Collectives issued in the window run
// as usual on their lane; the work endCoalescing returns completes after
// them too (after a marker queued behind them).
#include "coalescing.h"

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {

namespace {

// A work that ends when `a` and `b` have both ended, with the first error
// either had; waiting on it waits on both (joining their clocks).
std::shared_ptr<collectives::Work> BothDone(std::shared_ptr<collectives::Work> a,
                                            std::shared_ptr<collectives::Work> b) {
  struct State {
    std::mutex mutex;
    int left = 2;
    std::exception_ptr error;
  };
  auto both =
      std::make_shared<collectives::Work>(a->description() + " and " + b->description());
  auto state = std::make_shared<State>();
  auto one_done = [both, state, a, b](std::exception_ptr error) {
    std::unique_lock<std::mutex> lock(state->mutex);
    if (error != nullptr && state->error == nullptr) state->error = error;
    if (--state->left > 0) return;
    const std::exception_ptr first = state->error;
    lock.unlock();
    both->Finish(first, [a, b] {
      a->Wait();
      b->Wait();
    });
  };
  a->OnDone(one_done);
  b->OnDone(one_done);
  return both;
}

// Pairs each send to `rank` (itself) with the next receive from `rank` of the
// same tag: self_source[i] is the send a receive i copies from, -1 for the
// others. InvalidUsage naming the tag for a half without its other half or
// a pair whose sizes differ.
// (A template: Held is private to BackendNeuron, named only by the caller.)
template <typename Held>
std::vector<int> PairSelfMessages(const std::vector<Held>& held, int rank,
                                  const std::string& prefix) {
  std::vector<int> self_source(held.size(), -1);
  std::vector<bool> taken(held.size(), false);
  for (std::size_t s = 0; s < held.size(); ++s) {
    if (!held[s].send || held[s].peer != rank) continue;
    std::size_t r = 0;
    while (r < held.size() && (held[r].send || held[r].peer != rank || taken[r] ||
                               held[r].tag != held[s].tag)) {
      ++r;
    }
    NEURON_CHECK(r < held.size(), prefix, "batch_isend_irecv: a send to this rank itself (tag ",
                 held[s].tag, ") has no receive from this rank with that tag in the batch");
    NEURON_CHECK(Bytes(held[s].input) == Bytes(held[r].output.buffer()), prefix,
                 "batch_isend_irecv: a send to this rank itself (tag ", held[s].tag, ") has ",
                 Bytes(held[s].input), " bytes but its receive expects ",
                 Bytes(held[r].output.buffer()));
    taken[r] = true;
    self_source[r] = static_cast<int>(s);
  }
  for (std::size_t r = 0; r < held.size(); ++r) {
    NEURON_CHECK(held[r].send || held[r].peer != rank || taken[r], prefix,
                 "batch_isend_irecv: a receive from this rank itself (tag ", held[r].tag,
                 ") has no send to this rank with that tag in the batch");
  }
  return self_source;
}

}  // namespace

BackendNeuron::Coalescing& BackendNeuron::coalescing() { return *coalescing_; }

void BackendNeuron::startCoalescing() {
  Coalescing& state = coalescing();
  std::lock_guard<std::mutex> lock(state.mutex);
  NEURON_CHECK(!state.active, *prefix_,
               "startCoalescing: a coalescing window is already open (call endCoalescing)");
  state.active = true;
  state.collectives_before = sequence_.load();
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::Hold(bool send, at::Tensor& tensor, int peer,
                                                     int tag) {
  Coalescing& state = coalescing();
  Coalescing::Held held;
  held.send = send;
  held.peer = peer;
  held.tag = tag;
  if (send) {
    held.input = tensor.contiguous();
  } else {
    held.output = Output(tensor);
  }
  held.work = c10::make_intrusive<NeuronWork>(
      rank_, send ? ::c10d::OpType::SEND : ::c10d::OpType::RECV, send ? "send" : "recv",
      send ? Tensors{} : Tensors{tensor}, nullptr);
  auto work = held.work;
  std::lock_guard<std::mutex> lock(state.mutex);
  state.held.push_back(std::move(held));
  return work;
}

bool BackendNeuron::CoalescingActive() {
  Coalescing& state = coalescing();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.active;
}

c10::intrusive_ptr<::c10d::Work> BackendNeuron::endCoalescing() {
  Coalescing& state = coalescing();
  std::vector<Coalescing::Held> held;
  bool collectives_in_window = false;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    NEURON_CHECK(state.active, *prefix_, "endCoalescing without startCoalescing");
    state.active = false;
    held.swap(state.held);
    collectives_in_window = sequence_.load() != state.collectives_before;
  }
  if (held.empty()) {  // collectives only: a marker behind them on their lane
    return Enqueue(::c10d::OpType::COALESCED, "coalesced", [](collectives::Communicator&) {},
                   {}, ::c10d::kUnsetTimeout);
  }
  Tensors outputs;
  for (const auto& h : held) {
    if (!h.send) outputs.push_back(h.work->result()[0]);
  }
  const std::vector<int> self_source = PairSelfMessages(held, rank_, *prefix_);
  auto body = [held, self_source, rank = rank_](collectives::Communicator& c) {
    for (const auto& h : held) {
      if (h.send && h.peer != rank) {
        c.Send(h.peer, h.input.data_ptr(), Bytes(h.input), static_cast<std::uint64_t>(h.tag));
      }
    }
    for (std::size_t i = 0; i < held.size(); ++i) {
      const auto& h = held[i];
      if (h.send) continue;
      if (self_source[i] >= 0) {
        const at::Tensor& input = held[self_source[i]].input;
        std::memcpy(h.output.data(), input.data_ptr(), Bytes(input));
      } else {
        c.Recv(h.peer, h.output.data(), Bytes(h.output.buffer()),
               static_cast<std::uint64_t>(h.tag));
      }
      h.output.CopyBack();
    }
  };
  auto batch = Enqueue(::c10d::OpType::COALESCED, "coalesced send/recv", std::move(body),
                       outputs, ::c10d::kUnsetTimeout, true);
  const auto inner = static_cast<NeuronWork&>(*batch).inner();
  for (auto& h : held) h.work->Attach(inner);
  if (!collectives_in_window) return batch;
  // Collectives in the window too: the work ends after the batch and after a
  // marker behind them on their lane (neither lane waits for the other).
  auto marker = Enqueue(
      ::c10d::OpType::COALESCED, "coalesced", [](collectives::Communicator&) {}, {},
      ::c10d::kUnsetTimeout);
  auto work = c10::make_intrusive<NeuronWork>(rank_, ::c10d::OpType::COALESCED,
                                              "coalesced", std::move(outputs), nullptr);
  work->Attach(BothDone(inner, static_cast<NeuronWork&>(*marker).inner()));
  return work;
}

}  // namespace neuron::c10d
