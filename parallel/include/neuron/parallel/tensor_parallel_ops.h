// The collective functions of tensor and sequence parallelism (Megatron-LM's
// "mappings"), as autograd functions: each one's backward is the collective
// its forward's gradient needs, so layers built from them train correctly
// with plain loss.backward().
//
//   forward                          backward
//   CopyToGroup:      identity        all-reduce (sum)
//   ReduceFromGroup:  all-reduce      identity
//   GatherFromGroup:  all-gather(dim) keep own chunk of dim
//   ScatterToGroup:   own chunk(dim)  all-gather(dim)
//   GatherSequence:   all-gather(0)   reduce-scatter(0)
//   ReduceScatterSequence: reduce-scatter(0)   all-gather(0)
//
// Chunks are in group-rank order; dim must divide evenly by the group size
// (InvalidUsage naming the function, dim and sizes otherwise). Groups used
// here are kept alive for the process's lifetime (backward may run late).
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>

namespace c10d {
class ProcessGroup;
}

namespace neuron::parallel {

using GroupPtr = c10::intrusive_ptr<::c10d::ProcessGroup>;

at::Tensor CopyToGroup(const at::Tensor& x, const GroupPtr& group);
at::Tensor ReduceFromGroup(const at::Tensor& x, const GroupPtr& group);
at::Tensor GatherFromGroup(const at::Tensor& x, const GroupPtr& group, std::int64_t dim);
at::Tensor ScatterToGroup(const at::Tensor& x, const GroupPtr& group, std::int64_t dim);
at::Tensor GatherSequence(const at::Tensor& x, const GroupPtr& group);
at::Tensor ReduceScatterSequence(const at::Tensor& x, const GroupPtr& group);

// Cross-entropy of logits split over the vocabulary (the last dim: rank r
// holds vocabulary entries [r * V/n, (r + 1) * V/n)) without gathering them:
// global max, the target's logit and the sum of exponentials are all-reduced
// (Megatron-LM's vocab-parallel cross-entropy). Entries at or beyond
// `vocab_size` (padding so that n divides the vocabulary) are excluded, so
// the loss is exactly the unpadded one. `target`: int64, the logits' shape
// without the last dim. Returns the per-token loss (no reduction).
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     const GroupPtr& group, std::int64_t vocab_size);

}  // namespace neuron::parallel
