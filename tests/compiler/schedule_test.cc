// Scheduling: an instruction off the critical path listed first on its
// engine delays the critical one; list scheduling issues the critical one
// first, keeps every dependency, and keeps the order only when it is faster.
#include "neuron/compiler/schedule.h"

#include <gtest/gtest.h>

#include "neuron/runtime/device/plan_timing.h"

namespace neuron::compiler {
namespace {

namespace rp = runtime::proto;

rp::Instruction* Add(rp::Executable& e, std::uint32_t id, rp::EngineKind engine,
                     rp::Op op, std::uint32_t in, std::uint32_t out) {
  auto* i = e.add_instructions();
  i->set_id(id), i->set_engine(engine), i->set_op(op);
  i->add_inputs(in), i->add_outputs(out);
  return i;
}

TEST(Schedule, TheCriticalPathIssuesFirstAndDependenciesHold) {
  const runtime::CostModel model(runtime::DeviceSpec::Default());
  rp::Executable e;
  for (std::uint32_t b = 0; b < 5; ++b) {
    auto* buffer = e.add_buffers();
    buffer->set_id(b), buffer->set_space(rp::SBUF), buffer->set_dtype(rp::BF16);
  }
  rp::Instruction matmul;
  matmul.set_engine(rp::TENSOR), matmul.set_m(128), matmul.set_k(128), matmul.set_n(512);
  const double matmul_us = runtime::InstructionDuration(matmul, model, false).count();
  // An independent vector op taking about 0.8 of the matmul, listed first.
  rp::Instruction probe;
  probe.set_engine(rp::VECTOR), probe.set_elements(1 << 16), probe.set_operand_count(1);
  const double per_chunk = runtime::InstructionDuration(probe, model, false).count();
  const auto elements = static_cast<std::int64_t>((1 << 16) * 0.8 * matmul_us / per_chunk);
  auto* slow = Add(e, 0, rp::VECTOR, rp::OP_RELU, 0, 1);
  slow->set_elements(elements), slow->set_operand_count(1);
  auto* feed = Add(e, 1, rp::VECTOR, rp::OP_NEG, 0, 2);
  feed->set_elements(128), feed->set_operand_count(1);
  auto* mm = Add(e, 2, rp::TENSOR, rp::OP_MATMUL, 2, 4);
  mm->add_inputs(3), mm->set_m(128), mm->set_k(128), mm->set_n(512), mm->add_deps(1);

  const ScheduleResult r = ScheduleInstructions(e, model);
  EXPECT_TRUE(r.reordered);
  EXPECT_LT(r.after_us, r.before_us * 0.8);
  EXPECT_NEAR(r.after_us, runtime::TimePlan(e, model).total.count(), 1e-9);
  ASSERT_EQ(e.instructions_size(), 3);
  EXPECT_EQ(e.instructions(0).op(), rp::OP_NEG);  // the matmul's input first
  for (int k = 0; k < 3; ++k) EXPECT_EQ(e.instructions(k).id(), static_cast<std::uint32_t>(k));
  const auto& moved =
      *std::find_if(e.instructions().begin(), e.instructions().end(),
                    [](const rp::Instruction& i) { return i.op() == rp::OP_MATMUL; });
  ASSERT_EQ(moved.deps_size(), 1);
  EXPECT_EQ(e.instructions(static_cast<int>(moved.deps(0))).op(), rp::OP_NEG);

  // Already in the best order: kept as it is.
  const rp::Executable before = e;
  const ScheduleResult again = ScheduleInstructions(e, model);
  EXPECT_FALSE(again.reordered);
  EXPECT_EQ(e.SerializeAsString(), before.SerializeAsString());
}

}  // namespace
}  // namespace neuron::compiler
