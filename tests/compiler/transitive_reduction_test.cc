// TransitiveReduction keeps exactly the dependencies no other implies.
#include "transitive_reduction.h"

#include <gtest/gtest.h>

#include <vector>

#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

using Ids = std::vector<std::uint32_t>;

TEST(TransitiveReduction, KeepsOnlyDirectDependencies) {
  TransitiveReduction r;
  EXPECT_EQ(r.Direct({}), Ids{});              // 0
  EXPECT_EQ(r.Direct({0}), Ids{0});            // 1 after 0
  EXPECT_EQ(r.Direct({0, 1}), Ids{1});         // 2: 0 is implied through 1
  EXPECT_EQ(r.Direct({0}), Ids{0});            // 3: a second branch from 0
  EXPECT_EQ(r.Direct({3, 2, 0, 1, 2}), (Ids{2, 3}));  // 4: joins both, drops 0, 1 and the duplicate
  EXPECT_EQ(r.Direct({}), Ids{});              // 5: independent
  EXPECT_EQ(r.Direct({5, 4, 0}), (Ids{4, 5}));  // 6
}

TEST(TransitiveReduction, ReachesAcrossWordBoundaries) {
  TransitiveReduction r;
  r.Direct({});
  for (std::uint32_t s = 1; s < 200; ++s) r.Direct({s - 1});  // a chain
  Ids all;
  for (std::uint32_t s = 0; s < 200; ++s) all.push_back(s);
  EXPECT_EQ(r.Direct(all), Ids{199});
}

TEST(TransitiveReduction, RefusesADependencyThatIsNotEarlier) {
  TransitiveReduction r;
  r.Direct({});
  EXPECT_THROW(r.Direct({1}), Error);
}

}  // namespace
}  // namespace neuron::compiler
