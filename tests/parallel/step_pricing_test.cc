#include "neuron/parallel/step_pricing.h"

#include <gtest/gtest.h>

#include "neuron/parallel/layout_collectives.h"
#include "neuron/runtime/device/eager_cost.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/topology.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

using runtime::CostModel;
using runtime::DeviceSpec;

proto::CapturedOp Matmul(std::int64_t m, std::int64_t k, std::int64_t n) {
  proto::CapturedOp op;
  op.set_name("aten::mm.default");
  op.set_kind("matmul");
  op.set_batch(1);
  op.set_m(m);
  op.set_k(k);
  op.set_n(n);
  op.set_elements(m * n);
  op.set_inputs(2);
  op.set_bytes_in(2 * (m * k + k * n));
  op.set_bytes_out(2 * m * n);
  return op;
}

proto::CapturedOp Vector(std::int64_t elements) {
  proto::CapturedOp op;
  op.set_name("aten::add.Tensor");
  op.set_kind("vector");
  op.set_elements(elements);
  op.set_inputs(2);
  op.set_bytes_in(4 * elements);
  op.set_bytes_out(2 * elements);
  return op;
}

TEST(StepPricing, EagerPricingIsTheEagerDevicesOwnCharge) {
  const CostModel model(DeviceSpec::Default());
  PricingOptions eager{Pricing::kEager, 205};
  for (const auto& op : {Matmul(4096, 4096, 512), Matmul(3, 5, 7), Vector(1 << 20)}) {
    runtime::EagerOp e;
    e.kind = op.kind() == "matmul" ? runtime::EagerKind::kMatmul : runtime::EagerKind::kVector;
    e.matmul = {op.batch(), op.m(), op.k(), op.n()};
    e.elements = op.elements();
    e.inputs = op.inputs();
    e.bytes_in = op.bytes_in();
    e.bytes_out = op.bytes_out();
    EXPECT_DOUBLE_EQ(PriceOp(op, model, eager).us, runtime::EagerCost(model, e).count())
        << op.m();
  }
}

// A captured CPU fallback (sort) costs its copies over the host link, the
// CPU's kernel and the sync, eager or compiled (a CPU segment), on the host.
TEST(StepPricing, CpuFallbacksArePricedAsFallbacksOnTheHost) {
  const CostModel model(DeviceSpec::Default());
  proto::CapturedOp op;
  op.set_name("aten::sort.stable");
  op.set_kind("fallback");
  op.set_elements(2000);
  op.set_bytes_in(4000);
  op.set_bytes_out(12000);
  for (Pricing pricing : {Pricing::kEager, Pricing::kCompiled}) {
    const OpPrice price = PriceOp(op, model, {pricing, 205});
    EXPECT_DOUBLE_EQ(price.us, (2 + 4000 / 32e3) + 2000 / 1e3 + (2 + 12000 / 32e3) + 5)
        << Name(pricing);
    EXPECT_EQ(price.engine, "host");
  }
}

TEST(StepPricing, CompiledMatmulsPayTheOverheadPerInstructionWithoutTheFixedDmaCost) {
  const CostModel model(DeviceSpec::Default());
  const auto op = Matmul(4096, 4096, 4096);
  const runtime::MatmulCost mm = model.Matmul(4096, 4096, 4096, false);
  const double ghz = DeviceSpec::Default().spec().tensor().clock_ghz();
  const OpPrice none = PriceOp(op, model, {Pricing::kCompiled, 0});
  const OpPrice some = PriceOp(op, model, {Pricing::kCompiled, 100});
  EXPECT_DOUBLE_EQ(none.us, mm.time.count());  // compute-bound: no HBM roofline, no fixed cost
  EXPECT_DOUBLE_EQ(some.us - none.us, mm.instructions * 100 / (ghz * 1e3));
  EXPECT_EQ(some.engine, "tensor");
  EXPECT_DOUBLE_EQ(some.flops, 2.0 * 4096 * 4096 * 4096);
  // A vector op streaming its bytes is bound by HBM.
  const OpPrice add = PriceOp(Vector(1 << 24), model, {});
  EXPECT_DOUBLE_EQ(add.us, model.Hbm(6ull << 24).count());
  EXPECT_EQ(add.engine, "vector");
}

TEST(StepPricing, FlashAttentionIsCausalAndItsBackwardCostsMore) {
  const CostModel model(DeviceSpec::Default());
  proto::CapturedOp op;
  op.set_kind("matmul");
  auto* a = op.mutable_attention();
  a->set_batch_heads(4);
  a->set_query(4096);
  a->set_key(4096);
  a->set_head_dim(128);
  a->set_causal(true);
  const OpPrice forward = PriceOp(op, model, {});
  a->set_causal(false);
  const OpPrice full = PriceOp(op, model, {});
  a->set_backward(true);
  const OpPrice backward = PriceOp(op, model, {});
  // Causal: 33 of 64 key blocks per query block on average.
  EXPECT_NEAR(forward.flops / full.flops, 33.0 / 64, 1e-12);
  EXPECT_LT(forward.us, full.us);
  EXPECT_NEAR(backward.flops / full.flops, 2.5, 1e-12);  // five products against two
  EXPECT_GE(backward.us, 2 * full.us * (1 - 1e-12));  // and twice the vector passes
  EXPECT_DOUBLE_EQ(full.flops, 2.0 * 4096 * 4096 * 128 * 2 * 4);
}

TEST(StepPricing, PhasesAddTheirOpsAndTheirCollectivesApart) {
  proto::StepCapture capture;
  auto* phase = capture.add_phases();
  phase->set_name("layer_forward");
  *phase->add_steps()->mutable_op() = Matmul(256, 256, 256);
  auto* c = phase->add_steps()->mutable_collective();
  c->set_kind("allgather");
  c->set_axis("tp");
  c->set_bytes(1 << 20);
  *phase->add_steps()->mutable_op() = Vector(1000);
  const CostModel model(DeviceSpec::Default());
  std::vector<std::pair<std::string, double>> asked;
  const StepCosts costs = PriceStep(capture, model, {}, [&](const std::string& kind, double bytes,
                                                            const std::string& axis) {
    asked.emplace_back(kind + "/" + axis, bytes);
    return 7.5;
  });
  const PhaseCost& p = costs.at("layer_forward");
  EXPECT_EQ(p.ops, 2);
  EXPECT_EQ(p.collectives, 1);
  EXPECT_DOUBLE_EQ(p.tp_collective_us, 7.5);
  EXPECT_DOUBLE_EQ(p.compute_us, PriceOp(Matmul(256, 256, 256), model, {}).us +
                                     PriceOp(Vector(1000), model, {}).us);
  EXPECT_DOUBLE_EQ(p.total_us(), p.compute_us + 7.5);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].first, "allgather/tp");
  EXPECT_DOUBLE_EQ(asked[0].second, 1 << 20);
}

TEST(StepPricing, ExpertParallelAllToAllsArePricedApartFromTensorParallelCollectives) {
  proto::StepCapture capture;
  auto* phase = capture.add_phases();
  phase->set_name("layer_forward");
  for (const char* axis : {"ep", "tp", "ep"}) {
    auto* c = phase->add_steps()->mutable_collective();
    c->set_kind(std::string(axis) == "ep" ? "alltoall" : "allreduce");
    c->set_axis(axis);
    c->set_bytes(1 << 20);
  }
  const CostModel model(DeviceSpec::Default());
  const StepCosts costs = PriceStep(capture, model, {}, [](const std::string& kind, double,
                                                           const std::string& axis) {
    return kind == "alltoall" && axis == "ep" ? 3.0 : 5.0;
  });
  const PhaseCost& p = costs.at("layer_forward");
  EXPECT_DOUBLE_EQ(p.ep_collective_us, 6.0);
  EXPECT_DOUBLE_EQ(p.tp_collective_us, 5.0);
  EXPECT_DOUBLE_EQ(p.total_us(), 11.0);
  phase->mutable_steps(1)->mutable_collective()->set_axis("pp");
  try {
    PriceStep(capture, model, {}, [](const std::string&, double, const std::string&) {
      return 0.0;
    });
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("phase layer_forward: a allreduce on axis 'pp'"),
              std::string::npos)
        << e.what();
  }
}

// The expert-parallel group is ep consecutive data-parallel ranks at one
// tensor position (ranks 0, tp, 2 tp, ...): its all-to-all is the fabric
// model's for those ranks, inside a node while ep x tp ranks fit in one,
// over EFA beyond.
TEST(StepPricing, TheAllToAllIsPricedOnTheFabricForTheExpertParallelGroup) {
  const runtime::Topology node = runtime::Topology::Default();  // 16 ranks per node
  const runtime::FabricModel fabric(node, runtime::PlaceRanks(node, {16, 16}));
  const double bytes = 64 << 20;
  auto modelled = [&](std::vector<int> group) {
    return runtime::ModelCollective(fabric, "alltoall", bytes, group, 0,
                                    runtime::ConfiguredFabricAlgorithm())
        .micros;
  };
  LayoutCollectivePricer inside(fabric, /*tp=*/2, /*ep=*/8);
  EXPECT_EQ(inside.Group("ep"), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(inside.Group("tp"), (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(inside("alltoall", bytes, "ep"), modelled({0, 2, 4, 6, 8, 10, 12, 14}));
  LayoutCollectivePricer across(fabric, /*tp=*/4, /*ep=*/8);  // 32 ranks: two nodes
  EXPECT_DOUBLE_EQ(across("alltoall", bytes, "ep"), modelled({0, 4, 8, 12, 16, 20, 24, 28}));
  EXPECT_GT(across("alltoall", bytes, "ep"), 2 * inside("alltoall", bytes, "ep"));
  // More bytes cost more; a group of one rank costs nothing.
  EXPECT_GT(inside("alltoall", 2 * bytes, "ep"), inside("alltoall", bytes, "ep"));
  LayoutCollectivePricer alone(fabric, 4, 1);
  EXPECT_DOUBLE_EQ(alone("alltoall", bytes, "ep"), 0);
  EXPECT_THROW(alone("alltoall", bytes, "dp"), InvalidUsage);
  EXPECT_THROW(LayoutCollectivePricer(fabric, 8, 8), InvalidUsage);  // 64 ranks of 32
}

TEST(StepPricing, UnknownKindsAndNegativeSizesAreNamed) {
  const CostModel model(DeviceSpec::Default());
  auto op = Vector(10);
  op.set_kind("quantum");
  try {
    PriceOp(op, model, {});
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("aten::add.Tensor: unknown kind \"quantum\""),
              std::string::npos);
  }
  op = Matmul(2, 2, 2);
  op.set_m(-2);
  EXPECT_THROW(PriceOp(op, model, {}), InvalidUsage);
  EXPECT_EQ(ParsePricing("eager"), Pricing::kEager);
  EXPECT_THROW(ParsePricing("fast"), InvalidUsage);
}

}  // namespace
}  // namespace neuron::parallel
