// The core of data parallelism (torchneuron.parallel.DistributedDataParallel
// and C++ trainers): averages every parameter's gradient over a process
// group during backward, overlapping the all-reduce with the rest of the
// backward pass, as PyTorch's DDP Reducer does.
//
// Parameters are packed into buckets in reverse order (gradients become
// ready roughly last layer first), one dtype each: a small first bucket per
// dtype (1 MiB) so the first all-reduce starts early, then buckets of 25 MiB
// (a bucket closes once it reaches its cap).
// A hook on each parameter's gradient accumulator copies the accumulated
// gradient into its bucket; a full bucket is all-reduced asynchronously (SUM,
// then divided by the group size: the ranks' gradients are summed in rank
// order on "neuron", so results are bitwise reproducible). Buckets start in
// index order on every rank. At the end of backward every bucket is waited
// for and the averages written to the parameters' .grad.
//
//   GradientReducer reducer(params, group, {});
//   reducer.PrepareForBackward();   // before each synchronising backward
//   loss.backward();                // grads are averaged when it returns
//
// Without PrepareForBackward a backward is local (DDP's no_sync): gradients
// accumulate in .grad and the next synchronising backward averages the
// accumulated sums. A parameter that gets no gradient in a synchronising
// backward is an error naming it, unless find_unused_parameters: then it
// counts as ready with zeros, and a parameter unused on every rank keeps its
// .grad untouched.
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace neuron::parallel {

struct ReducerOptions {
  std::int64_t bucket_cap_bytes = 25 << 20;
  std::int64_t first_bucket_bytes = 1 << 20;
  bool find_unused_parameters = false;
  // .grad becomes a view into its bucket: no copy back after the all-reduce,
  // and gradient accumulation writes straight into the buckets.
  bool gradient_as_bucket_view = false;
  // For messages: parameter i is called names[i] (default "parameter i").
  std::vector<std::string> names;
};

struct Bucket {
  std::vector<std::size_t> parameters;  // indices into the reducer's parameters
  std::vector<std::int64_t> offsets;    // element offset of each in the bucket
  std::int64_t elements = 0;
  at::ScalarType dtype;
};

// Packs the parameters (in reverse order) into buckets as described above.
std::vector<Bucket> AssignBuckets(const std::vector<at::Tensor>& parameters,
                                  std::int64_t first_bucket_bytes,
                                  std::int64_t bucket_cap_bytes);

class GradientReducer {
 public:
  // Every parameter must be a dense tensor that requires grad (InvalidUsage
  // names the first that is not).
  GradientReducer(std::vector<at::Tensor> parameters,
                  c10::intrusive_ptr<::c10d::ProcessGroup> group, ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the next backward to average gradients. InvalidUsage if the last
  // armed backward never ran to completion (it would leave ranks behind).
  void PrepareForBackward();

  const std::vector<Bucket>& buckets() const;
  // All-reduces started by the last synchronising backward.
  std::int64_t allreduces() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Averages the .grad of `parameters` over `group` after a backward that ran
// without a reducer (pipeline stages, explicit accumulation): packed into
// per-dtype messages of up to `bucket_bytes`, summed in rank order, divided
// by the group size. A parameter without .grad counts as zeros and gets the
// average.
void AverageGradients(const std::vector<at::Tensor>& parameters, ::c10d::ProcessGroup& group,
                      std::int64_t bucket_bytes = 25 << 20);

// Replaces `tensors` (views may be given: written in place) by their sums
// over `group`, in rank order, packed into flat per-dtype messages of up to
// `bucket_bytes`.
void SumCoalesced(const std::vector<at::Tensor>& tensors, ::c10d::ProcessGroup& group,
                  std::int64_t bucket_bytes = 25 << 20);

// Makes `tensors` equal to rank `root`'s on every rank of `group`, packed
// into flat per-dtype messages of up to `bucket_bytes` (DDP's start).
void BroadcastCoalesced(std::vector<at::Tensor> tensors, ::c10d::ProcessGroup& group,
                        int root = 0, std::int64_t bucket_bytes = 25 << 20);

}  // namespace neuron::parallel
