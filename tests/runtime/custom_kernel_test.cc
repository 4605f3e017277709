// Custom kernels in a plan (OP_CUSTOM_KERNEL, custom_kernels.h): priced by
// their own time on every engine they hold, validated, and run by the
// executor through the callback registered under their key.
#include <gtest/gtest.h>

#include <cstring>

#include "error_of.h"
#include "neuron/runtime/device/custom_kernels.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/device/plan_timing.h"

namespace neuron::runtime {
namespace {

using testing::ErrorOf;

constexpr int kN = 256;  // float32 elements

void AddBuffer(proto::Executable& e, std::uint32_t id, std::uint64_t offset) {
  auto* b = e.add_buffers();
  b->set_id(id);
  b->set_name("b" + std::to_string(id));
  b->set_space(proto::HBM);
  b->set_offset(offset);
  b->set_bytes(kN * 4);
  b->set_dtype(proto::F32);
  b->add_shape(kN);
}

// x (HBM) -> kernel `key` (10 us on vector and DMA) -> y (HBM) -> load into
// SBUF -> relu on the vector engine: a chain.
proto::Executable KernelPlan(const std::string& key) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion);
  e.set_name("custom/kernel/0");
  AddBuffer(e, 0, 0);
  AddBuffer(e, 1, 4096);
  AddBuffer(e, 2, 8192);
  auto* sbuf = e.add_buffers();
  *sbuf = e.buffers(2);
  sbuf->set_id(3);
  sbuf->set_space(proto::SBUF);
  sbuf->set_offset(0);
  auto* k = e.add_instructions();
  k->set_id(0);
  k->set_op(proto::OP_CUSTOM_KERNEL);
  k->set_engine(proto::VECTOR);
  k->set_kernel(key);
  k->set_kernel_us(10);
  k->add_kernel_engines(proto::VECTOR), k->add_kernel_busy_us(6);
  k->add_kernel_engines(proto::DMA), k->add_kernel_busy_us(4);
  k->set_bytes(2 * kN * 4);
  k->add_inputs(0), k->add_outputs(1);
  auto* load = e.add_instructions();
  load->set_id(1), load->set_engine(proto::DMA), load->set_op(proto::OP_LOAD);
  load->set_bytes(kN * 4), load->set_partitions(1), load->add_deps(0);
  load->add_inputs(1), load->add_outputs(3);
  auto* relu = e.add_instructions();
  relu->set_id(2), relu->set_engine(proto::VECTOR), relu->set_op(proto::OP_RELU);
  relu->set_elements(kN), relu->set_operand_count(1), relu->add_deps(1);
  relu->add_inputs(3), relu->add_outputs(2);
  auto* x = e.add_inputs();
  x->set_name("x"), x->set_buffer(0);
  auto* y = e.add_outputs();
  y->set_name("y"), y->set_buffer(2);
  return e;
}

TEST(CustomKernel, LastsItsOwnTimeHoldingItsEnginesInAChain) {
  const proto::Executable e = KernelPlan("test::negate");
  ValidateExecutable(e, DeviceSpec::Default());
  const CostModel model(DeviceSpec::Default());
  const PlanTiming t = TimePlan(e, model);
  ASSERT_EQ(t.schedule.size(), 3u);
  EXPECT_EQ(t.schedule[0].op, "test::negate");
  EXPECT_DOUBLE_EQ(t.schedule[0].end.count(), 10.0);
  EXPECT_EQ(t.schedule[0].also, std::vector<Engine>{Engine::kDma});
  const double load = InstructionDuration(e.instructions(1), model, false).count();
  const double relu = InstructionDuration(e.instructions(2), model, false).count();
  EXPECT_DOUBLE_EQ(t.schedule[1].start.count(), 10.0);  // after the kernel
  EXPECT_NEAR(t.total.count(), 10.0 + load + relu, 1e-9);
  EXPECT_DOUBLE_EQ(t.busy[static_cast<int>(Engine::kVector)].count(), 6.0 + relu);
  EXPECT_EQ(t.hbm_bytes, 2u * kN * 4 + kN * 4);
}

TEST(CustomKernel, TheExecutorRunsTheRegisteredCallback) {
  RegisterCustomKernel("test::negate", [](const std::vector<KernelOperand>& in,
                                          const std::vector<KernelOperand>& out) {
    ASSERT_EQ(in.size(), 1u);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(in[0].shape, std::vector<std::int64_t>{kN});
    const auto* x = reinterpret_cast<const float*>(in[0].data);
    auto* y = reinterpret_cast<float*>(out[0].data);
    for (int k = 0; k < kN; ++k) y[k] = -x[k];
  });
  std::vector<float> values(kN);
  for (int k = 0; k < kN; ++k) values[k] = static_cast<float>(k % 7) - 3.0f;
  Executor exec(DeviceSpec::Default());
  const auto r =
      exec.Run(KernelPlan("test::negate"), {{"x", HostTensor::FromFloats(proto::F32, {kN},
                                                                          values)}});
  const auto y = r.outputs.at("y").ToFloats();
  for (int k = 0; k < kN; ++k) EXPECT_EQ(y[k], std::max(-values[k], 0.0f)) << k;
  EXPECT_NE(ErrorOf([&] {
              exec.Run(KernelPlan("test::unknown"),
                       {{"x", HostTensor::FromFloats(proto::F32, {kN}, values)}});
            }).find("custom kernel 'test::unknown' is not registered"),
            std::string::npos);
}

TEST(CustomKernel, UnsoundInstructionsAreRefusedNamingThem) {
  proto::Executable e = KernelPlan("test::negate");
  e.mutable_instructions(0)->set_engine(proto::TENSOR);
  EXPECT_NE(ErrorOf([&] { ValidateExecutable(e, DeviceSpec::Default()); })
                .find("runs on TENSOR, which is not one of its engines"),
            std::string::npos);
  e = KernelPlan("test::negate");
  e.mutable_instructions(0)->set_kernel_busy_us(0, 11);
  EXPECT_NE(ErrorOf([&] { ValidateExecutable(e, DeviceSpec::Default()); })
                .find("engine VECTOR busy 11 us of its 10"),
            std::string::npos);
  e = KernelPlan("");
  EXPECT_NE(ErrorOf([&] { ValidateExecutable(e, DeviceSpec::Default()); })
                .find("a custom kernel needs its kernel key"),
            std::string::npos);
}

}  // namespace
}  // namespace neuron::runtime
