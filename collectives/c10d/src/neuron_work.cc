#include "neuron_work.h"

#include <ATen/core/ivalue.h>

#include "neuron/collectives/async_communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {

NeuronWork::NeuronWork(int rank, ::c10d::OpType type, const char* profiling_title,
                       std::vector<at::Tensor> outputs, std::shared_ptr<int> source_rank)
    : ::c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      source_rank_(std::move(source_rank)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void NeuronWork::Attach(std::shared_ptr<collectives::Work> inner) {
  inner_ = std::move(inner);
  // The callback holds the future and the outputs, not this work: the
  // work may be dropped (fire-and-forget) before the operation ends.
  auto future = future_;
  auto outputs = outputs_;
  auto record_end = recordFunctionEndCallback_;
  inner_->OnDone([future, outputs, record_end](std::exception_ptr error) {
    if (record_end) record_end();
    if (error) {
      future->setError(error);
    } else {
      future->markCompleted(c10::IValue(outputs));
    }
  });
}

namespace {

// A send or recv held in a coalescing window has no operation until
// endCoalescing queues the batch.
void CheckAttached(const std::shared_ptr<collectives::Work>& inner) {
  NEURON_CHECK(inner != nullptr,
               "this send/recv belongs to an open coalescing window: it runs at "
               "endCoalescing; wait for the work that returns (batch_isend_irecv's)");
}

}  // namespace

bool NeuronWork::isCompleted() {
  CheckAttached(inner_);
  return inner_->Test();
}

bool NeuronWork::isSuccess() const {
  CheckAttached(inner_);
  return inner_->Test() && inner_->exception() == nullptr;
}

std::exception_ptr NeuronWork::exception() const {
  CheckAttached(inner_);
  return inner_->exception();
}

int NeuronWork::sourceRank() const {
  NEURON_CHECK(source_rank_ != nullptr && *source_rank_ >= 0,
               "sourceRank: only a completed receive from any source has one");
  return *source_rank_;
}

bool NeuronWork::wait(std::chrono::milliseconds timeout) {
  CheckAttached(inner_);
  inner_->Wait(timeout == ::kNoTimeout ? collectives::Work::kForever : timeout);
  return true;
}

}  // namespace neuron::c10d
