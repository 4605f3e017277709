// How long a schedule of transfers takes on the simulated fabric.
//
// Each transfer follows its route (FabricGraph). Within a step, transfers
// that share a link share its bandwidth equally; a transfer moves at the
// rate of its most contended link and pays the latency of every hop:
//   time = sum(hop latency) + bytes / min over links (bandwidth / sharers).
// Ranks on the same chip exchange through the on-chip link (HBM DMA).
// A transfer marked `reduce` is reduced at the receiver
// (ReductionBytesPerSecond, shared by the transfers reducing at the same
// rank in that step) in two slices, the first slice's reduction overlapping
// the second slice's transfer, as Neuron's ring reduce-scatter does: with
// wire time w = bytes / link rate and reduction time r = bytes / reduce rate,
//   time = sum(hop latency) + (w + r + max(w, r)) / 2.
//
// Stages and chunks (schedule.h): with k chunks each stage's time is that
// of its steps on bytes / k. Stages that share a link (or a chip's on-chip
// link) never run at once; otherwise they overlap across chunks. A rank's
// reductions in overlapping stages are not charged against each other: the
// DMA engines doing them are many (16 per core) and each stage has its own
// rings. Each stage takes the chunks in order; event by event, a stage
// starts its next chunk as soon as that chunk has left the previous stage
// and no stage it conflicts with is running (later stages first when
// several could). Stages on disjoint links so give the flow-shop closed form:
//   total = sum over stages of t_s + (k - 1) x max over stages of t_s.
//
// Calibration (the topology's collective_engine.calibration,
// CollectiveCalibration): a collective's schedule (one with a kind) of at
// least one step costs launch_us plus its algorithm's fixed_us more, and
// every step its algorithm's step_us more: once, or, when a rank's sends go
// one after another (Schedule::serial_sends, mesh), times the most peers one
// rank sends to in that step. Every transfer moves no faster than its sender's
// collective DMA rate (core_dma_gbps times its cores) shared by what the
// sender sends in that step, nor than its receiver's shared by what it
// receives.
//
// Usage:
//   FabricModel model(Topology::Default(), PlaceRanks(topology, {16}));
//   SimDuration t = model.Simulate(RingAllReduce(order, bytes)).total;
#pragma once

#include <cstdint>
#include <vector>

#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/fabric/collective_calibration.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/schedule.h"
#include "neuron/runtime/sim_time.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

struct SimulationResult {
  SimDuration total{0};
  std::vector<SimDuration> steps;   // per step, on one chunk
  std::vector<SimDuration> stages;  // per stage, on one chunk
  double link_bytes = 0;  // bytes x hops summed over transfers (all chunks)
};

class FabricModel {
 public:
  // `placement[r]` is where rank r sits (Topology::Place); `device` is the
  // NeuronCore whose DMA and HBM figures price reductions.
  FabricModel(const Topology& topology, std::vector<ChipPlacement> placement,
              const DeviceSpec& device = DeviceSpec::Default());

  SimulationResult Simulate(const Schedule& schedule) const;

  const FabricGraph& graph() const { return graph_; }
  const std::vector<ChipPlacement>& placement() const { return placement_; }
  const Topology& topology() const { return topology_; }
  const CollectiveCalibration& calibration() const { return calibration_; }
  int world_size() const { return static_cast<int>(placement_.size()); }
  int num_nodes() const { return num_nodes_; }

 private:
  struct StepShares;
  StepShares CountShares(const Step& step) const;
  // One transfer's time in its step (`route`: scratch space).
  SimDuration TransferTime(const Transfer& t, const StepShares& shares, double scale,
                           std::vector<int>& route, double* link_bytes) const;
  SimDuration StepTime(const Step& step, double scale, double* link_bytes) const;
  // Resource ids a stage's steps use: link ids, then chips (on-chip
  // copies); sorted, unique.
  std::vector<int> StageResources(const Schedule& schedule, const Stage& stage) const;
  // Pipelines `chunks` chunks through stages taking `stage_us` each.
  double PipelineMicros(const Schedule& schedule, const std::vector<Stage>& stages,
                        const std::vector<double>& stage_us) const;

  Topology topology_;
  std::vector<ChipPlacement> placement_;
  int num_nodes_;
  FabricGraph graph_;
  CollectiveCalibration calibration_;
  double reduce_bytes_per_second_;  // per rank
};

// Places `ranks_per_node[i]` ranks on node i, in rank order (as neuronrun does).
std::vector<ChipPlacement> PlaceRanks(const Topology& topology,
                                      const std::vector<std::uint32_t>& ranks_per_node);

}  // namespace neuron::runtime
