// Scans lowered and run: cumsum along any dim equals the in-order running
// sum bitwise (float32 accumulated in double, as ATen's CPU kernel), flip
// reverses raw elements, the training pattern (flip, cumsum, flip) stays
// on the device, and each scan is one vector-engine pass over its elements.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/lower.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/device/plan_timing.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

using runtime::DeviceSpec;
using runtime::HostTensor;
namespace rp = runtime::proto;

std::vector<float> Ramp(int n) {  // values whose sums round: not exact in float
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>((i * 7) % 11) - 0.33f;
  return v;
}

// The running sum of x [A, B, C] along `dim`, in order, in double.
std::vector<float> Cumsum(const std::vector<float>& x, int A, int B, int C, int dim) {
  const int len = dim == 0 ? A : dim == 1 ? B : C;
  const int inner = dim == 0 ? B * C : dim == 1 ? C : 1;
  const int outer = A * B * C / (len * inner);
  std::vector<float> y(x.size());
  for (int o = 0; o < outer; ++o)
    for (int i = 0; i < inner; ++i) {
      double s = 0;
      for (int t = 0; t < len; ++t) {
        const int k = (o * len + t) * inner + i;
        s += x[k];
        y[k] = static_cast<float>(s);
      }
    }
  return y;
}

std::map<std::string, HostTensor> RunGraph(const proto::Graph& g, const std::vector<float>& x,
                                      std::vector<std::int64_t> shape) {
  const DeviceSpec device = DeviceSpec::Default();
  return runtime::Executor(device)
      .Run(Lower(g, device).executable,
           {{"x", HostTensor::FromFloats(rp::F32, std::move(shape), x)}})
      .outputs;
}

TEST(LowerScans, CumsumAlongEachDimIsTheInOrderSumBitwise) {
  const proto::Graph g = ParseGraph(R"(graph scans(%x: f32[3,40,5]) {
    %a: f32[3,40,5] = aten.cumsum(%x) {dim = 0}
    %b: f32[3,40,5] = aten.cumsum(%x) {dim = 1}
    %c: f32[3,40,5] = aten.cumsum(%x) {dim = -1}
    return %a, %b, %c
  })");
  const auto x = Ramp(3 * 40 * 5);
  const auto out = RunGraph(g, x, {3, 40, 5});
  EXPECT_EQ(out.at("a").ToFloats(), Cumsum(x, 3, 40, 5, 0));
  EXPECT_EQ(out.at("b").ToFloats(), Cumsum(x, 3, 40, 5, 1));
  EXPECT_EQ(out.at("c").ToFloats(), Cumsum(x, 3, 40, 5, 2));
}

// cumsum's gradient as AOTAutograd writes it: flip, cumsum, flip.
TEST(LowerScans, TheGradientPatternFlipCumsumFlipIsAReverseRunningSum) {
  const proto::Graph g = ParseGraph(R"(graph grad(%x: f32[2,6,3]) {
    %f: f32[2,6,3] = aten.flip(%x) {dims = [1]}
    %s: f32[2,6,3] = aten.cumsum(%f) {dim = 1}
    %y: f32[2,6,3] = aten.flip(%s) {dims = [1]}
    %z: f32[2,6,3] = aten.flip(%x) {dims = [0, 2]}
    return %y, %z
  })");
  const auto x = Ramp(36);
  const auto out = RunGraph(g, x, {2, 6, 3});
  std::vector<float> y(36), z(36);
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 3; ++c) {
      double s = 0;
      for (int t = 5; t >= 0; --t) {
        s += x[(a * 6 + t) * 3 + c];
        y[(a * 6 + t) * 3 + c] = static_cast<float>(s);
      }
      for (int t = 0; t < 6; ++t)
        z[(a * 6 + t) * 3 + c] = x[((1 - a) * 6 + t) * 3 + (2 - c)];
    }
  EXPECT_EQ(out.at("y").ToFloats(), y);
  EXPECT_EQ(out.at("z").ToFloats(), z);
}

TEST(LowerScans, AScanIsOneVectorPassOverItsElements) {
  const proto::Graph g = ParseGraph(R"(graph one(%x: f32[4,256]) {
    %s: f32[4,256] = aten.cumsum(%x) {dim = 1}
    return %s
  })");
  const auto lowered = Lower(g, DeviceSpec::Default());
  int scans = 0;
  for (const auto& i : lowered.executable.instructions()) {
    if (i.op() != rp::OP_CUMSUM) continue;
    ++scans;
    EXPECT_EQ(i.engine(), rp::VECTOR);
    EXPECT_EQ(i.elements(), 4 * 256);
    EXPECT_EQ(i.operand_count(), 1u);
    EXPECT_EQ(i.m(), 4);
    EXPECT_EQ(i.n(), 256);
    EXPECT_EQ(i.k(), 1);
  }
  EXPECT_EQ(scans, 1);
  // Priced as 4 lines of 256 walked in order (CostModel::Scan), one line per
  // lane: 256 cycles (+ the wait on the load), not 4 x 256 / 128 = 8.
  const runtime::CostModel model(DeviceSpec::Default());
  for (const auto& i : lowered.executable.instructions()) {
    if (i.op() != rp::OP_CUMSUM) continue;
    EXPECT_EQ(runtime::InstructionDuration(i, model, false).count(),
              model.Scan(runtime::Engine::kVector, 4, 256, i.deps_size() > 0).count());
    EXPECT_GT(runtime::InstructionDuration(i, model, false).count(),
              model.Elementwise(runtime::Engine::kVector, 4 * 256, 1, true).count());
  }
}

TEST(LowerScans, AnIntegerOrDtypeChangingCumsumIsRefusedNamingTheNode) {
  const proto::Graph ints = ParseGraph(R"(graph ints(%x: i64[4]) {
    %s: i64[4] = aten.cumsum(%x) {dim = 0}
    return %s
  })");
  try {
    Lower(ints, DeviceSpec::Default());
    FAIL() << "an i64 cumsum was lowered";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("aten.cumsum"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i64 cumsum"), std::string::npos) << e.what();
  }
  const proto::Graph wide = ParseGraph(R"(graph wide(%x: bf16[4]) {
    %s: f32[4] = aten.cumsum(%x) {dim = 0, dtype = "f32"}
    return %s
  })");
  EXPECT_THROW(Lower(wide, DeviceSpec::Default()), InvalidUsage);
}

}  // namespace
}  // namespace neuron::compiler
