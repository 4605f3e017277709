// Coalescing (startCoalescing .. endCoalescing): what batch_isend_irecv and
// _coalescing_manager use. Point-to-point operations issued in the window
// are held and run as one operation at endCoalescing, every send before
// every receive. Sends are buffered (up to Communicator::kMaxBufferedBytes),
// so two ranks that each list "receive, then send" do not wait on each other
// as they would on one in-order lane. Collectives issued in the window run
// as usual; the work endCoalescing returns completes after all of them.
#include "coalescing.h"

#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {

BackendNeuron::Coalescing& BackendNeuron::coalescing() { return *coalescing_; }

void BackendNeuron::startCoalescing() {
  Coalescing& state = coalescing();
  std::lock_guard<std::mutex> lock(state.mutex);
  NEURON_CHECK(!state.active, *prefix_,
               "startCoalescing: a coalescing window is already open (call endCoalescing)");
  state.active = true;
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
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    NEURON_CHECK(state.active, *prefix_, "endCoalescing without startCoalescing");
    state.active = false;
    held.swap(state.held);
  }
  if (held.empty()) {  // collectives only: a marker behind them on their lane
    return Enqueue(::c10d::OpType::COALESCED, "coalesced", [](collectives::Communicator&) {},
                   {}, ::c10d::kUnsetTimeout);
  }
  Tensors outputs;
  for (const auto& h : held) {
    if (!h.send) outputs.push_back(h.work->result()[0]);
  }
  auto body = [held](collectives::Communicator& c) {
    for (const auto& h : held) {
      if (h.send) {
        c.Send(h.peer, h.input.data_ptr(), Bytes(h.input), static_cast<std::uint64_t>(h.tag));
      }
    }
    for (const auto& h : held) {
      if (!h.send) {
        c.Recv(h.peer, h.output.data(), Bytes(h.output.buffer()),
               static_cast<std::uint64_t>(h.tag));
        h.output.CopyBack();
      }
    }
  };
  auto batch = Enqueue(::c10d::OpType::COALESCED, "coalesced send/recv", std::move(body),
                       std::move(outputs), ::c10d::kUnsetTimeout, true);
  const auto inner = static_cast<NeuronWork&>(*batch).inner();
  for (auto& h : held) h.work->Attach(inner);
  return batch;
}

}  // namespace neuron::c10d
