#include "neuron/parallel/sharded_unit.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../c10d/group_threads.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

using c10d::testing::RunProcessGroup;

c10::intrusive_ptr<::c10d::ProcessGroup> Owned(::c10d::ProcessGroup& pg) {
  return c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&pg);
}

// Two layers, each its own unit; 7 + 5 + 5*3 + 3 parameters does not divide
// by 2 or 3 ranks, so the flat vectors are padded.
struct Layers {
  at::Tensor w1 = at::linspace(-1, 1, 7 * 5).view({7, 5}).requires_grad_(true);
  at::Tensor b1 = at::linspace(0, 0.5, 5).requires_grad_(true);
  at::Tensor w2 = at::linspace(1, -1, 5 * 3).view({5, 3}).requires_grad_(true);
  at::Tensor b2 = at::linspace(-0.2, 0.2, 3).requires_grad_(true);
  static at::Tensor Input(int rank, int step) {
    return at::cos(at::arange(4 * 7, at::kFloat).view({4, 7}) * (rank + 1) + step);
  }
  at::Tensor Loss(const at::Tensor& x) const {
    return at::tanh(at::mm(x, w1) + b1).mm(w2).add(b2).pow(2).mean();
  }
};

// The expected gradients: every rank's, summed in rank order, / n.
std::vector<at::Tensor> ReferenceGrads(const Layers& start, int n, int step) {
  std::vector<at::Tensor> total(4);
  for (int r = 0; r < n; ++r) {
    Layers m;
    for (auto [dst, src] : {std::pair{&m.w1, &start.w1}, {&m.b1, &start.b1}, {&m.w2, &start.w2},
                            {&m.b2, &start.b2}}) {
      *dst = src->detach().clone().requires_grad_(true);
    }
    m.Loss(Layers::Input(r, step)).backward();
    const at::Tensor g[] = {m.w1.grad(), m.b1.grad(), m.w2.grad(), m.b2.grad()};
    for (int i = 0; i < 4; ++i) total[i] = total[i].defined() ? total[i] + g[i] : g[i];
  }
  for (auto& t : total) t = t / n;
  return total;
}

at::Tensor Flat(std::initializer_list<at::Tensor> ts, std::int64_t padded) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.reshape(-1));
  at::Tensor flat = at::zeros({padded});
  at::Tensor cat = at::cat(parts);
  flat.narrow(0, 0, cat.numel()).copy_(cat);
  return flat;
}

class ShardedUnitStages : public ::testing::TestWithParam<int> {};

TEST_P(ShardedUnitStages, ShardGradientsAndStepsEqualTheRankOrderAverageBitwise) {
  const int stage = GetParam();
  for (int n : {2, 3}) {
    RunProcessGroup(n, [&](::c10d::ProcessGroup& pg, int rank) {
      Layers m;
      Layers reference;  // the same start, updated by the same rule in full
      ShardedUnit first({m.w1, m.b1}, Owned(pg), {stage, at::kFloat, at::kFloat, "first"});
      ShardedUnit second({m.w2, m.b2}, Owned(pg), {stage, at::kFloat, at::kFloat, "second"});
      EXPECT_FALSE(first.gathered());
      for (int step = 0; step < 3; ++step) {
        const auto want = ReferenceGrads(reference, n, step);
        first.PrepareForBackward();
        second.PrepareForBackward();
        first.Gather();
        second.Gather();
        at::Tensor loss = m.Loss(Layers::Input(rank, step));
        if (stage == 3) {  // free after forward, re-gather before backward
          first.Free();
          second.Free();
          EXPECT_EQ(m.w1.numel(), 0);
          loss.register_hook([&](const at::Tensor& g) {
            first.Gather();
            second.Gather();
            return g;
          });
        }
        loss.backward();
        EXPECT_FALSE(m.w1.grad().defined()) << "full gradients are not kept";
        for (auto [unit, grads] :
             {std::pair{&first, Flat({want[0], want[1]}, first.padded_numel())},
              std::pair{&second, Flat({want[2], want[3]}, second.padded_numel())}}) {
          const std::int64_t s = unit->shard().numel();
          EXPECT_TRUE(at::equal(unit->shard().grad(), grads.narrow(0, rank * s, s)))
              << "stage " << stage << ", " << n << " ranks, rank " << rank << ", step " << step;
          at::NoGradGuard no_grad;
          unit->shard().sub_(unit->shard().grad() * 0.5);
          unit->shard().mutable_grad().reset();
          unit->MarkStale();
        }
        at::NoGradGuard no_grad;
        reference.w1.sub_(want[0] * 0.5);
        reference.b1.sub_(want[1] * 0.5);
        reference.w2.sub_(want[2] * 0.5);
        reference.b2.sub_(want[3] * 0.5);
      }
      const auto full = first.FullParameters();
      EXPECT_TRUE(at::equal(full[0], reference.w1.detach()));
      EXPECT_TRUE(at::equal(second.FullParameters()[1], reference.b2.detach()));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStage, ShardedUnitStages, ::testing::Values(1, 2, 3));

TEST(ShardedUnit, LoadsFullValuesAndRefusesWrongShapesNamingTheUnit) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    Layers m;
    ShardedUnit unit({m.w1, m.b1}, Owned(pg), {3, at::kFloat, at::kFloat, "layer0"});
    unit.LoadFullParameters({at::full({7, 5}, 2.0), at::full({5}, 3.0)});
    unit.Gather();
    EXPECT_TRUE(at::equal(m.w1.detach(), at::full({7, 5}, 2.0)));
    EXPECT_TRUE(at::equal(m.b1.detach(), at::full({5}, 3.0)));
    try {
      unit.LoadFullParameters({at::zeros({5, 7}), at::zeros({5})});
      ADD_FAILURE() << "no error";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("sharded unit 'layer0' (ZeRO stage 3, rank " +
                                           std::to_string(rank) +
                                           " of 2): parameter 0 has shape [7, 5] but the "
                                           "value loaded has [5, 7]"),
                std::string::npos)
          << e.what();
    }
  });
}

// A unit's parameters share one device: its buffers live there.
TEST(ShardedUnit, RefusesParametersOnTwoDevicesNamingThem) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int) {
    at::Tensor on_cpu = at::zeros({4}).requires_grad_(true);
    at::Tensor on_meta = at::empty({4}, at::TensorOptions().device(at::kMeta)).requires_grad_(true);
    try {
      ShardedUnit unit({on_cpu, on_meta}, Owned(pg), {3, at::kFloat, at::kFloat, "mixed"});
      ADD_FAILURE() << "no error";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 1 is on meta, parameter 0 on cpu (a unit's "
                                           "parameters share a device)"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(ShardedUnit, Bfloat16ComputeOverFloat32MasterWeights) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    Layers m;
    const at::Tensor w1 = m.w1.detach().clone();
    ShardedUnit unit({m.w1, m.b1}, Owned(pg), {2, at::kBFloat16, at::kFloat, "mixed"});
    unit.Gather();
    EXPECT_EQ(m.w1.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(m.w1.detach(), w1.to(at::kBFloat16)));
    EXPECT_EQ(unit.shard().scalar_type(), at::kFloat);
    unit.PrepareForBackward();
    at::Tensor x = Layers::Input(rank, 0).to(at::kBFloat16);
    at::mm(x, m.w1).add(m.b1).sum().backward();
    ASSERT_TRUE(unit.shard().grad().defined());
    EXPECT_EQ(unit.shard().grad().scalar_type(), at::kFloat);
  });
}

}  // namespace
}  // namespace neuron::parallel
