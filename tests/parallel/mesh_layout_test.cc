#include "neuron/parallel/mesh_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

TEST(MeshLayout, TensorRanksAreContiguousPipelineStagesStridedDataTheRest) {
  const MeshLayout mesh = MeshLayout::Create(16, {2, 2, 0});  // tp 2, pp 2: dp 4
  EXPECT_EQ(mesh.size(Axis::kData), 4);
  EXPECT_EQ(mesh.Group(Axis::kTensor, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.Group(Axis::kData, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(mesh.Group(Axis::kPipeline, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(mesh.Coordinates(13), (MeshCoordinates{1, 2, 1}));
  EXPECT_EQ(mesh.Describe(), "tp=2 x dp=4 x pp=2 (16 ranks)");
}

TEST(MeshLayout, EveryAxisPartitionsTheRanksAndCoordinatesRoundTrip) {
  for (const MeshShape shape : {MeshShape{1, 1, 0}, MeshShape{2, 1, 0}, MeshShape{1, 4, 0},
                                MeshShape{4, 2, 0}, MeshShape{2, 2, 3}}) {
    const int world = shape.dp ? shape.tp * shape.pp * shape.dp : 8 * shape.tp * shape.pp / 2;
    const MeshLayout mesh = MeshLayout::Create(world, shape);
    for (int r = 0; r < world; ++r) EXPECT_EQ(mesh.Rank(mesh.Coordinates(r)), r);
    for (Axis axis : {Axis::kTensor, Axis::kData, Axis::kPipeline}) {
      std::multiset<int> seen;
      const auto groups = mesh.Groups(axis);
      EXPECT_EQ(static_cast<int>(groups.size()) * mesh.size(axis), world) << Name(axis);
      for (const auto& g : groups) {
        EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
        for (int r : g) {
          seen.insert(r);
          EXPECT_EQ(mesh.Group(axis, r), g) << Name(axis) << " group of rank " << r;
        }
      }
      for (int r = 0; r < world; ++r) EXPECT_EQ(seen.count(r), 1u) << Name(axis) << " " << r;
    }
  }
}

TEST(MeshLayout, SizesThatDoNotFitTheWorldAreRefusedNamingThem) {
  auto message = [](int world, MeshShape shape) {
    try {
      MeshLayout::Create(world, shape);
    } catch (const InvalidUsage& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(6, {4, 1, 0}).find("world size 6 is not divisible by tp x pp = 4 x 1 = 4"),
            std::string::npos);
  EXPECT_NE(message(16, {2, 2, 2}).find("tp x dp x pp = 2 x 2 x 2 = 8 but the world size is 16"),
            std::string::npos);
  EXPECT_NE(message(8, {0, 1, 0}).find("tp and pp must be >= 1"), std::string::npos);
  EXPECT_NE(message(8, {2, 1, 0}).find("no error"), std::string::npos);
  const MeshLayout mesh = MeshLayout::Create(4, {2, 1, 0});
  EXPECT_THROW(mesh.Coordinates(4), InvalidUsage);
  EXPECT_THROW(mesh.Rank({2, 0, 0}), InvalidUsage);
}

}  // namespace
}  // namespace neuron::parallel
