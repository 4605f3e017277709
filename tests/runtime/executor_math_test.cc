// The executor's float math against libm: exp, exact GELU and its
// backward, softmax over masked rows and a repeating masked_fill, each run
// as a one-instruction plan over values that include the edges (infinities,
// NaN, underflow, values past erf's saturation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"

namespace neuron::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void AddBuffer(proto::Executable& e, std::uint32_t id, std::uint64_t offset,
               proto::ElementType dtype, std::int64_t n) {
  auto* b = e.add_buffers();
  b->set_id(id), b->set_name("b" + std::to_string(id)), b->set_space(proto::SBUF);
  b->set_offset(offset), b->set_dtype(dtype), b->add_shape(n);
  b->set_bytes(n * ElementBytes(dtype));
}

// One instruction `op` over inputs "a" (and "b", "mask") into "y".
std::vector<float> RunOp(proto::Op op, const std::vector<float>& a,
                         const std::vector<float>& b = {},
                         const std::vector<std::uint8_t>& mask = {},
                         std::int64_t rows = 0, double scalar = 0) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("math");
  const auto n = static_cast<std::int64_t>(a.size());
  AddBuffer(e, 0, 0, proto::F32, n);
  AddBuffer(e, 1, 4 * n, proto::F32, n);
  auto* i = e.add_instructions();
  i->set_id(0), i->set_op(op), i->set_elements(n), i->set_scalar(scalar);
  i->set_engine(op == proto::OP_SOFTMAX_ROWS || op == proto::OP_EXP ? proto::SCALAR
                                                                    : proto::VECTOR);
  std::map<std::string, HostTensor> inputs;
  auto bind = [&](const std::string& name, std::uint32_t id, HostTensor t) {
    i->add_inputs(id);
    auto* in = e.add_inputs();
    in->set_name(name), in->set_buffer(id);
    inputs[name] = std::move(t);
  };
  bind("a", 0, HostTensor::FromFloats(proto::F32, {n}, a));
  if (!b.empty()) {
    AddBuffer(e, 2, 8 * n, proto::F32, n);
    bind("b", 2, HostTensor::FromFloats(proto::F32, {n}, b));
  }
  if (!mask.empty()) {
    const auto m = static_cast<std::int64_t>(mask.size());
    AddBuffer(e, 3, 12 * n, proto::BOOL, m);
    HostTensor t;
    t.dtype = proto::BOOL, t.shape = {m}, t.data = mask;
    bind("mask", 3, std::move(t));
  }
  if (rows > 0) i->set_m(rows), i->set_n(n / rows);
  i->set_operand_count(static_cast<std::uint32_t>(i->inputs_size()));
  i->add_outputs(1);
  auto* y = e.add_outputs();
  y->set_name("y"), y->set_buffer(1);
  return Executor(DeviceSpec::Default()).Run(e, inputs).outputs.at("y").ToFloats();
}

std::vector<float> Grid(float from, float to, float step) {
  std::vector<float> x;
  for (float v = from; v <= to; v += step) x.push_back(v);
  return x;
}

TEST(ExecutorMath, ExpIsWithinAnUlpOfLibmAndKeepsItsEdges) {
  std::vector<float> x = Grid(-100, 100, 0.0137f);
  for (float v : {0.0f, -0.0f, kInf, -kInf, std::nanf(""), 88.7f, -86.99f, 1e-8f, -1e-8f})
    x.push_back(v);
  const std::vector<float> y = RunOp(proto::OP_EXP, x);
  ASSERT_EQ(y.size(), x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    const float want = std::exp(x[k]);
    if (std::isnan(x[k])) {
      EXPECT_TRUE(std::isnan(y[k]));
    } else if (want < 1.7e-38f) {  // underflow is flushed to zero
      EXPECT_LE(y[k], 1.7e-38f) << x[k];
    } else if (std::isinf(want)) {
      EXPECT_EQ(y[k], kInf) << x[k];
    } else {
      EXPECT_NEAR(y[k], want, 1.2e-7 * want) << x[k];
    }
  }
  EXPECT_EQ(y[x.size() - 6], 0.0f);  // e^-inf
}

TEST(ExecutorMath, ExactGeluAndItsBackwardFollowErf) {
  std::vector<float> x = Grid(-12, 12, 0.0031f);
  for (float v : {30.0f, -30.0f, 1e-6f, -1e-6f}) x.push_back(v);
  const std::vector<float> y = RunOp(proto::OP_GELU_EXACT, x);
  std::vector<float> g(x.size());
  for (std::size_t k = 0; k < x.size(); ++k)
    g[k] = 0.5f + 0.001f * static_cast<float>(k % 7);
  const std::vector<float> dx = RunOp(proto::OP_GELU_EXACT_BACKWARD, g, x);
  for (std::size_t k = 0; k < x.size(); ++k) {
    const double v = x[k], cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    EXPECT_NEAR(y[k], v * cdf, 2e-7 * (1 + std::fabs(v))) << v;
    EXPECT_NEAR(dx[k], g[k] * (cdf + v * pdf), 4e-7) << v;
  }
}

TEST(ExecutorMath, SoftmaxOverCausallyMaskedRowsMatchesTheReference) {
  // A row is not a whole number of lanes. Float rounds x - max, so a small
  // probability is good to a few ulp of the difference, not of itself.
  constexpr int kRows = 24, kCols = 19;
  std::vector<float> x(kRows * kCols);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      x[r * kCols + c] =
          c > r ? -kInf : std::sin(0.37f * static_cast<float>(r * kCols + c)) * 9;
    }
  }
  const std::vector<float> y = RunOp(proto::OP_SOFTMAX_ROWS, x, {}, {}, kRows);
  for (int r = 0; r < kRows; ++r) {
    double max = -kInf, sum = 0;
    for (int c = 0; c < kCols; ++c) max = std::max<double>(max, x[r * kCols + c]);
    for (int c = 0; c < kCols; ++c) sum += std::exp(x[r * kCols + c] - max);
    for (int c = 0; c < kCols; ++c) {
      const double want = std::exp(x[r * kCols + c] - max) / sum;
      if (c > r) {
        EXPECT_EQ(y[r * kCols + c], 0.0f);
      } else {
        EXPECT_NEAR(y[r * kCols + c], want, 2e-6 * want) << r << "," << c;
      }
    }
  }
}

TEST(ExecutorMath, MaskedFillRepeatsItsMaskOverTheTensor) {
  const std::vector<float> x = Grid(0, 29, 1);
  const std::vector<std::uint8_t> mask = {1, 0, 0, 1, 0, 1, 0, 0, 0, 1};
  const std::vector<float> y = RunOp(proto::OP_MASKED_FILL, x, {}, mask, 0, -kInf);
  ASSERT_EQ(y.size(), 30u);
  for (std::size_t k = 0; k < y.size(); ++k) {
    EXPECT_EQ(y[k], mask[k % mask.size()] ? -kInf : x[k]) << k;
  }
}

}  // namespace
}  // namespace neuron::runtime
