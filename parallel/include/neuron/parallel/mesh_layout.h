// The 3D layout of a job's ranks: tensor parallel (tp) x data parallel (dp)
// x pipeline parallel (pp), Megatron's order. Tensor-parallel ranks are
// contiguous (the same chip or node on the fabric, where links are fastest),
// pipeline stages are strided by tp x dp, data parallel takes the rest:
//
//   rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
//
// Torch-free arithmetic; parallel::Initialize (C++) and
// torchneuron.parallel.initialize (Python) build the process groups from it.
//
//   MeshLayout mesh = MeshLayout::Create(16, {.tp = 2, .pp = 2});  // dp = 4
//   mesh.Group(Axis::kTensor, 5)  ->  {4, 5}
#pragma once

#include <string>
#include <vector>

namespace neuron::parallel {

enum class Axis { kTensor, kData, kPipeline };
const char* Name(Axis axis);  // "tensor", "data", "pipeline"

struct MeshShape {
  int tp = 1;
  int pp = 1;
  int dp = 0;  // 0: world / (tp x pp)
};

struct MeshCoordinates {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  bool operator==(const MeshCoordinates& o) const {
    return tp == o.tp && dp == o.dp && pp == o.pp;
  }
};

class MeshLayout {
 public:
  // Throws InvalidUsage naming the sizes when a size is < 1, when tp x pp
  // does not divide `world`, or when a given dp does not complete it.
  static MeshLayout Create(int world, MeshShape shape);

  int world() const { return world_; }
  int size(Axis axis) const;

  MeshCoordinates Coordinates(int rank) const;  // InvalidUsage outside 0..world-1
  int Rank(const MeshCoordinates& c) const;

  // The members (job ranks, ascending) of the `axis` group holding `rank`.
  std::vector<int> Group(Axis axis, int rank) const;
  // Every group of `axis`, in a fixed order every rank agrees on (process
  // groups must be created by every rank in the same order).
  std::vector<std::vector<int>> Groups(Axis axis) const;

  // "tp=2 x dp=4 x pp=2 (16 ranks)"
  std::string Describe() const;

 private:
  MeshLayout(int world, int tp, int dp, int pp) : world_(world), tp_(tp), dp_(dp), pp_(pp) {}
  int world_, tp_, dp_, pp_;
};

}  // namespace neuron::parallel
