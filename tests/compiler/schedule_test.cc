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

// A returned value's store needs nothing after it, so its priority (its
// own duration) is below a load's that the end of the compute needs: the
// priority order lists it behind that load, and the DMA queue holds it
// there until the compute is done. Listed in that order, only the schedule
// by start time shortens the plan: the store goes out as soon as its value
// is written, beside the compute.
TEST(Schedule, AStoreOverlapsTheComputeAfterIt) {
  const runtime::CostModel model(runtime::DeviceSpec::Default());
  rp::Executable e;
  for (std::uint32_t b = 0; b < 9; ++b) {
    auto* buffer = e.add_buffers();
    buffer->set_id(b), buffer->set_space(b >= 7 ? rp::HBM : rp::SBUF);
    buffer->set_dtype(rp::F32);
  }
  auto vector_op = [&](std::uint32_t id, std::uint32_t in, std::uint32_t out,
                       std::int64_t elements) {
    auto* i = Add(e, id, rp::VECTOR, rp::OP_NEG, in, out);
    i->set_elements(elements), i->set_operand_count(1);
    return i;
  };
  vector_op(0, 0, 1, 1 << 17);
  for (std::uint32_t id = 1; id <= 3; ++id) {
    vector_op(id, id, id + 1, 1 << 17)->add_deps(id - 1);
  }
  auto* load = Add(e, 4, rp::DMA, rp::OP_LOAD, 8, 5);  // after the chain (reuse)
  load->set_bytes(1 << 20), load->set_partitions(128), load->add_deps(3);
  auto* store = Add(e, 5, rp::DMA, rp::OP_STORE, 1, 7);
  store->set_bytes(1 << 12), store->set_partitions(128), store->add_deps(0);
  vector_op(6, 5, 6, 128)->add_deps(4);
  // The premises: the store is shorter than the load and what follows it
  // (so ranked after the load), longer than that last op, and shorter than
  // the chain it can hide behind.
  auto span = [&](int k) {
    return runtime::InstructionDuration(e.instructions(k), model, false).count();
  };
  ASSERT_LT(span(5), span(4) + span(6));
  ASSERT_GT(span(5), span(6));
  ASSERT_LT(span(5), span(1) + span(2) + span(3));
  const double listed = runtime::TimePlan(e, model).total.count();

  const ScheduleResult r = ScheduleInstructions(e, model);
  EXPECT_TRUE(r.reordered);
  EXPECT_LT(r.after_us, listed);
  EXPECT_NEAR(r.after_us, runtime::TimePlan(e, model).total.count(), 1e-9);
  ASSERT_EQ(e.instructions_size(), 7);
  int store_at = -1, load_at = -1;
  for (int k = 0; k < 7; ++k) {
    if (e.instructions(k).op() == rp::OP_STORE) store_at = k;
    if (e.instructions(k).op() == rp::OP_LOAD) load_at = k;
  }
  EXPECT_LT(store_at, load_at);  // first on the DMA queue
  const auto timing = runtime::TimePlan(e, model);  // done before the load starts
  EXPECT_LE(timing.schedule[static_cast<std::size_t>(store_at)].end.count(),
            timing.schedule[static_cast<std::size_t>(load_at)].start.count());
}

}  // namespace
}  // namespace neuron::compiler
