// The c10d::Work handle of one "neuron" operation: a view of the
// collectives' Work (wait, test, error) plus the torch side of completion,
// a c10::ivalue::Future completed with the output tensors (DDP's comm hooks
// chain on it) or with the error.
#pragma once

#include <memory>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace neuron::collectives {
class Work;
}

namespace neuron::c10d {

class NeuronWork : public ::c10d::Work {
 public:
  // `source_rank` is filled in by a receive from any source.
  NeuronWork(int rank, ::c10d::OpType type, const char* profiling_title,
             std::vector<at::Tensor> outputs, std::shared_ptr<int> source_rank);

  // Binds the queued operation; its completion completes the future (on the
  // progress thread). Called once, before the work is handed out.
  void Attach(std::shared_ptr<collectives::Work> inner);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // Blocks until done (at most `timeout`, unless it is c10d's kNoTimeout),
  // rethrows the operation's error; joins the rank's simulated clocks.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // The queued operation (null until Attach).
  const std::shared_ptr<collectives::Work>& inner() const { return inner_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<int> source_rank_;
  std::shared_ptr<collectives::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace neuron::c10d
