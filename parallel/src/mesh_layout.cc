#include "neuron/parallel/mesh_layout.h"

#include "neuron/runtime/error.h"

namespace neuron::parallel {

const char* Name(Axis axis) {
  switch (axis) {
    case Axis::kTensor: return "tensor";
    case Axis::kData: return "data";
    case Axis::kPipeline: return "pipeline";
  }
  return "?";
}

MeshLayout MeshLayout::Create(int world, MeshShape shape) {
  NEURON_CHECK(world >= 1, "parallel layout: world size must be >= 1, got ", world);
  NEURON_CHECK(shape.tp >= 1 && shape.pp >= 1 && shape.dp >= 0,
               "parallel layout: tp and pp must be >= 1 and dp >= 0 (0: the rest), got tp=",
               shape.tp, " pp=", shape.pp, " dp=", shape.dp);
  NEURON_CHECK(world % (shape.tp * shape.pp) == 0, "parallel layout: world size ", world,
               " is not divisible by tp x pp = ", shape.tp, " x ", shape.pp, " = ",
               shape.tp * shape.pp);
  const int dp = world / (shape.tp * shape.pp);
  NEURON_CHECK(shape.dp == 0 || shape.dp == dp, "parallel layout: tp x dp x pp = ", shape.tp,
               " x ", shape.dp, " x ", shape.pp, " = ", shape.tp * shape.dp * shape.pp,
               " but the world size is ", world);
  return MeshLayout(world, shape.tp, dp, shape.pp);
}

int MeshLayout::size(Axis axis) const {
  switch (axis) {
    case Axis::kTensor: return tp_;
    case Axis::kData: return dp_;
    case Axis::kPipeline: return pp_;
  }
  return 0;
}

MeshCoordinates MeshLayout::Coordinates(int rank) const {
  NEURON_CHECK(rank >= 0 && rank < world_, "parallel layout: rank ", rank, " outside 0..",
               world_ - 1);
  return {rank % tp_, rank / tp_ % dp_, rank / (tp_ * dp_)};
}

int MeshLayout::Rank(const MeshCoordinates& c) const {
  NEURON_CHECK(c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_,
               "parallel layout: coordinates tp=", c.tp, " dp=", c.dp, " pp=", c.pp,
               " outside ", Describe());
  return c.pp * (dp_ * tp_) + c.dp * tp_ + c.tp;
}

std::vector<int> MeshLayout::Group(Axis axis, int rank) const {
  MeshCoordinates c = Coordinates(rank);
  std::vector<int> members;
  for (int i = 0; i < size(axis); ++i) {
    (axis == Axis::kTensor ? c.tp : axis == Axis::kData ? c.dp : c.pp) = i;
    members.push_back(Rank(c));
  }
  return members;
}

std::vector<std::vector<int>> MeshLayout::Groups(Axis axis) const {
  // Each group once, in the order of its lowest member.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_; ++r) {
    std::vector<int> g = Group(axis, r);
    if (g.front() == r) groups.push_back(std::move(g));
  }
  return groups;
}

std::string MeshLayout::Describe() const {
  return StrCat("tp=", tp_, " x dp=", dp_, " x pp=", pp_, " (", world_, " ranks)");
}

}  // namespace neuron::parallel
