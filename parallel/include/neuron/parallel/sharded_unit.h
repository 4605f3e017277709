// ZeRO / FSDP-style sharding of one wrapped unit of a model (a module and
// the parameters it owns) over a data-parallel process group.
//
// The unit's parameters are flattened, in order, into one fp32 vector padded
// to a multiple of the group size n; rank r keeps slice r of it, the master
// shard, which is what the optimizer updates (so optimizer state is sharded
// at every stage). The module computes with full parameters: each parameter
// is a view into the unit's full buffer, filled by an all-gather of the
// shards (cast to param_dtype first: bf16 compute over fp32 master weights).
//
//   stage 1: full gradients are all-reduced; the shard's slice is kept.
//   stage 2: gradients are reduce-scattered: each rank only ever holds its
//            shard's averaged gradient after the unit's backward.
//   stage 3: as 2, and the full buffer is freed after the unit's forward and
//            after its backward; the module re-gathers before each.
//
// Gradients are reduced in reduce_dtype, summed in rank order and divided
// by n (with fp32 throughout, ZeRO's results equal DDP's bitwise), cast to
// fp32 and accumulated into shard().grad. A hook on each parameter's
// gradient accumulator moves its gradient into the unit's flat gradient (and
// drops .grad); once the unit has every gradient its reduction starts
// asynchronously, and the end of backward waits for it. Parameters that get
// no gradient in a backward count as zeros. SetRequireGradientSync(false)
// accumulates full gradients locally instead (no_sync).
//
//   ShardedUnit unit(params, group, {.stage = 3});
//   unit.Gather();  ... forward ...  unit.Free();
//   unit.PrepareForBackward();  loss.backward();  // shard().grad() is set
//   optimizer over {unit.shard()}
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

struct ShardingOptions {
  int stage = 3;  // 1, 2 or 3
  at::ScalarType param_dtype = at::kFloat;   // of the gathered parameters (compute)
  at::ScalarType reduce_dtype = at::kFloat;  // of the gradient reduction
  std::string name = "unit";                 // for messages
  // CPU offload: the fp32 master shard and its gradient (and so the
  // optimizer's state) live in host memory, moved to the parameters' device
  // for each gather and back for each gradient, and are not counted as
  // device model-state memory.
  bool offload = false;
  // Sequence parallelism: the flagged parameters (one flag per parameter, or
  // none) were used on a sequence shard of `sequence_parallel_group`, so
  // their gradients are summed over that group (one all-reduce of them all)
  // before the unit's own reduction.
  std::vector<bool> sequence_parallel = {};
  c10::intrusive_ptr<::c10d::ProcessGroup> sequence_parallel_group = {};
};

class ShardedUnit {
 public:
  // `params`: dense fp32 leaves that require grad, all on one device (the
  // CPU, or "neuron"): the unit's shards, full buffer and gradients live
  // there. Their values become the shards (rank r's slice of every rank's
  // copy: pass equal values, e.g. after a broadcast); from then on they are
  // views of the full buffer.
  ShardedUnit(std::vector<at::Tensor> params, c10::intrusive_ptr<::c10d::ProcessGroup> group,
              ShardingOptions options);
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;

  // The fp32 master shard (a leaf requiring grad, padded_numel() / n elements).
  at::Tensor shard() const;
  std::int64_t numel() const;         // of the parameters, unpadded
  std::int64_t padded_numel() const;  // a multiple of the group size
  int stage() const;

  // Full parameters: StartGather launches the all-gather (a no-op when the
  // buffer is current or a gather is in flight), WaitGather completes it.
  void StartGather();
  void WaitGather();
  void Gather();
  // Releases the full buffer (using a parameter before the next Gather is an error).
  void Free();
  bool gathered() const;
  bool gathering() const;  // an all-gather started and not yet waited for (prefetch)
  // The shard changed (an optimizer step): the next Gather must fetch it.
  void MarkStale();

  // Called by each forward whose backward must reduce this unit's gradients:
  // that many backwards (pipeline microbatches, gradient accumulation) each
  // reduce theirs, and the reductions add up in shard().grad.
  void PrepareForBackward();

  // Collective: the unit's parameters in full, fp32, in order (for state
  // dicts and checkpoints); and the inverse, from full values on every rank.
  std::vector<at::Tensor> FullParameters();
  void LoadFullParameters(const std::vector<at::Tensor>& values);
  // The same for any tensor shaped like the shard (optimizer state):
  // Unshard all-gathers it and splits it per parameter; Shard (local) is the
  // inverse, this rank's slice of per-parameter full values.
  std::vector<at::Tensor> Unshard(const at::Tensor& shard_like);
  at::Tensor Shard(const std::vector<at::Tensor>& values) const;

  // Gradient accumulation without communication (FSDP's no_sync): while
  // false, each backward adds its gradients into the unit's full flat
  // gradient (reduce_dtype, held between backwards) and reduces nothing; the
  // next backward with sync reduces the sum of them all, so the result
  // equals DDP's no_sync. Default true.
  void SetRequireGradientSync(bool sync);
  // Drops what no_sync backwards accumulated (an abandoned accumulation:
  // the optimizer's zero_grad cannot see it, it is not a .grad yet).
  void DiscardAccumulatedGradients();

  // Sum over this rank's shard of grad^2 (for clipping across shards), of
  // the parameters flagged in `counted` (one flag per parameter:
  // tensor-parallel replicas are counted on one rank only).
  double LocalGradSquaredNorm(const std::vector<bool>& counted) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Model-state memory: what device memory ZeRO's formulas count (parameters,
// gradients, optimizer state; not activations), over every sharded unit of
// the process plus the optimizer state bytes the trainer reports, with the
// peak since ResetModelStatePeak. Stages 2 and 3 keep at most two units'
// full gradients alive (a third reduction completes the oldest).
struct ModelStateMemory {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
};
ModelStateMemory ShardedModelStateMemory();
void SetOptimizerStateBytes(std::uint64_t bytes);
void ResetModelStatePeak();

}  // namespace neuron::parallel
