// Stage-to-stage messages: tagged, carrying shape and dtype, checked on
// arrival (ranks as threads over "neuron" groups).
#include "neuron/parallel/pipeline_p2p.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "../c10d/group_threads.h"
#include "../runtime/error_of.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

using c10d::testing::RunProcessGroup;
using runtime::testing::ErrorOf;

TEST(PipelineP2p, MessagesArriveByTagInAnyOrderWithShapeAndDtype) {
  RunProcessGroup(2, [](::c10d::ProcessGroup& pg, int rank) {
    if (rank == 0) {
      // Sent in one order, received in another: each has its own tag.
      auto a = SendStageTensor(pg, 1, at::arange(6, at::kFloat).view({2, 3}), {false, 0, 1});
      auto b = SendStageTensor(pg, 1, at::ones({4}, at::kLong), {false, 1, 1});
      for (auto& w : a) w->wait();
      for (auto& w : b) w->wait();
    } else {
      const at::Tensor second = RecvStageTensor(pg, 0, {false, 1, 1}, std::nullopt);
      const at::Tensor first = RecvStageTensor(pg, 0, {false, 0, 1}, std::nullopt);
      EXPECT_TRUE(at::equal(first, at::arange(6, at::kFloat).view({2, 3})));
      EXPECT_EQ(second.scalar_type(), at::kLong);
      EXPECT_TRUE(at::equal(second, at::ones({4}, at::kLong)));
    }
  });
}

TEST(PipelineP2p, AGradientOfTheWrongShapeNamesStageMicrobatchAndBothShapes) {
  RunProcessGroup(2, [](::c10d::ProcessGroup& pg, int rank) {
    if (rank == 1) {
      for (auto& w : SendStageTensor(pg, 0, at::zeros({3, 5}), {true, 2, 0})) w->wait();
    } else {
      const at::Tensor output = at::zeros({3, 4});  // what the gradient belongs to
      const std::string error =
          ErrorOf([&] { RecvStageTensor(pg, 1, {true, 2, 0}, output); });
      EXPECT_NE(error.find("pipeline: rank 0 receiving the gradient of microbatch 2 for "
                           "virtual stage 0 from rank 1: shape [3, 5] Float does not match "
                           "the output it belongs to, [3, 4] Float"),
                std::string::npos)
          << error;
    }
  });
}

}  // namespace
}  // namespace neuron::parallel
