// The C++ face of torchneuron.parallel.initialize: the tensor-, data- and
// pipeline-parallel "neuron" process groups of this rank, from a store every
// rank of the job shares (a libtorch trainer's c10d::TCPStore, say).
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
//   ParallelGroups g = InitializeParallel(store, rank, world, {.tp = 2, .pp = 2});
//   g.tensor->allreduce(...);   g.layout.Coordinates(rank).dp
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>

#include "neuron/parallel/mesh_layout.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace neuron::parallel {

struct ParallelGroups {
  MeshLayout layout;
  int rank = 0;
  c10::intrusive_ptr<::c10d::ProcessGroup> world, tensor, data, pipeline;
};

// Collective over the job: every rank calls it with the same shape.
// InvalidUsage (naming the sizes) when the shape does not fit `world`.
ParallelGroups InitializeParallel(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                  int world, MeshShape shape,
                                  std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace neuron::parallel
