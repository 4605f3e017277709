// The executor's float math against libm and double-precision references:
// exp, exact GELU and its backward, softmax over masked rows, the softmaxes'
// backward, layer norm and its backward, and a repeating masked_fill, each
// run as a one-instruction plan over values that include the edges
// (infinities, NaN, underflow, values past erf's saturation, rows that are
// not a whole number of lanes), in each lane count the kernels run in
// (lane_width.h: 4, 8 and 16 on any CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/device/lane_width.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/half.h"
#include "sbuf_buffer.h"

namespace neuron::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using testing::AddBuffer;

// A plan of one instruction `op` over n elements into "y" (buffer 1, at
// byte 4n), its inputs bound by name into the buffers Bind places.
class OneInstruction {
 public:
  OneInstruction(proto::Op op, std::int64_t n) {
    e_.set_format_version(kExecutableFormatVersion), e_.set_name("math");
    AddBuffer(e_, 1, 4 * n, proto::F32, n);  // y
    i_ = e_.add_instructions();
    i_->set_id(0), i_->set_op(op), i_->set_elements(n);
  }
  proto::Instruction& instruction() { return *i_; }

  // Input `name` in buffer `id` at `offset`, the instruction's next operand.
  void Bind(const std::string& name, std::uint32_t id, std::uint64_t offset,
            const std::vector<float>& values) {
    const auto n = static_cast<std::int64_t>(values.size());
    AddBuffer(e_, id, offset, proto::F32, n);
    Add(name, id, HostTensor::FromFloats(proto::F32, {n}, values));
  }
  void BindMask(const std::string& name, std::uint32_t id, std::uint64_t offset,
                const std::vector<std::uint8_t>& mask) {
    const auto m = static_cast<std::int64_t>(mask.size());
    AddBuffer(e_, id, offset, proto::BOOL, m);
    HostTensor t;
    t.dtype = proto::BOOL, t.shape = {m}, t.data.assign(mask.begin(), mask.end());
    Add(name, id, std::move(t));
  }

  std::vector<float> Run() {
    i_->set_operand_count(static_cast<std::uint32_t>(i_->inputs_size()));
    i_->add_outputs(1);
    auto* y = e_.add_outputs();
    y->set_name("y"), y->set_buffer(1);
    return Executor(DeviceSpec::Default()).Run(e_, inputs_).outputs.at("y").ToFloats();
  }

 private:
  void Add(const std::string& name, std::uint32_t id, HostTensor t) {
    i_->add_inputs(id);
    auto* in = e_.add_inputs();
    in->set_name(name), in->set_buffer(id);
    inputs_[name] = std::move(t);
  }

  proto::Executable e_;
  proto::Instruction* i_;
  std::map<std::string, HostTensor> inputs_;
};

// One instruction `op` over inputs "a" (and "b", "mask") into "y".
std::vector<float> RunOp(proto::Op op, const std::vector<float>& a,
                         const std::vector<float>& b = {},
                         const std::vector<std::uint8_t>& mask = {},
                         std::int64_t rows = 0, double scalar = 0) {
  const auto n = static_cast<std::int64_t>(a.size());
  OneInstruction plan(op, n);
  proto::Instruction& i = plan.instruction();
  i.set_scalar(scalar);
  i.set_engine(op == proto::OP_SOFTMAX_ROWS || op == proto::OP_EXP ? proto::SCALAR
                                                                   : proto::VECTOR);
  plan.Bind("a", 0, 0, a);
  if (!b.empty()) plan.Bind("b", 2, 8 * n, b);
  if (!mask.empty()) plan.BindMask("mask", 3, 12 * n, mask);
  if (rows > 0) i.set_m(rows), i.set_n(n / rows);
  return plan.Run();
}

// Each test in each lane count; the CPU's count again afterwards.
class ExecutorMath : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SetLaneWidth(GetParam()); }
  void TearDown() override { SetLaneWidth(0); }
};

INSTANTIATE_TEST_SUITE_P(Lanes, ExecutorMath, ::testing::Values(4, 8, 16),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param);
                         });

std::vector<float> Grid(float from, float to, float step) {
  std::vector<float> x;
  for (float v = from; v <= to; v += step) x.push_back(v);
  return x;
}

TEST_P(ExecutorMath, ExpIsWithinAnUlpOfLibmAndKeepsItsEdges) {
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

// As torch's CPU kernels: correctly rounded, NaN below zero, -0 kept.
TEST(ExecutorSqrt, SqrtAndRsqrtAreCorrectlyRoundedWithTheirEdges) {
  std::vector<float> x = Grid(0, 1000, 0.731f);
  for (float v : {0.0f, -0.0f, kInf, -1.0f, -kInf, std::nanf(""), 1e-38f, 3e38f, 2.0f})
    x.push_back(v);
  const std::vector<float> root = RunOp(proto::OP_SQRT, x);
  const std::vector<float> inverse = RunOp(proto::OP_RSQRT, x);
  ASSERT_EQ(root.size(), x.size());
  ASSERT_EQ(inverse.size(), x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    if (std::isnan(x[k]) || x[k] < 0) {
      EXPECT_TRUE(std::isnan(root[k]) && std::isnan(inverse[k])) << x[k];
      continue;
    }
    EXPECT_EQ(half_detail::Bits(root[k]), half_detail::Bits(std::sqrt(x[k]))) << x[k];
    EXPECT_EQ(half_detail::Bits(inverse[k]), half_detail::Bits(1.0f / std::sqrt(x[k]))) << x[k];
  }
  EXPECT_TRUE(std::signbit(root[x.size() - 8]));    // sqrt(-0) = -0
  EXPECT_EQ(inverse[x.size() - 9], kInf);           // rsqrt(0) = inf
  EXPECT_EQ(inverse[x.size() - 8], -kInf);          // rsqrt(-0) = -inf
}

TEST_P(ExecutorMath, ExactGeluAndItsBackwardFollowErf) {
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

TEST_P(ExecutorMath, SoftmaxOverCausallyMaskedRowsMatchesTheReference) {
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

TEST_P(ExecutorMath, MaskedFillRepeatsItsMaskOverTheTensor) {
  const std::vector<float> x = Grid(0, 29, 1);
  const std::vector<std::uint8_t> mask = {1, 0, 0, 1, 0, 1, 0, 0, 0, 1};
  const std::vector<float> y = RunOp(proto::OP_MASKED_FILL, x, {}, mask, 0, -kInf);
  ASSERT_EQ(y.size(), 30u);
  for (std::size_t k = 0; k < y.size(); ++k) {
    EXPECT_EQ(y[k], mask[k % mask.size()] ? -kInf : x[k]) << k;
  }
}

// Row-wise values in about [-3, 3], differing in every row and column.
std::vector<float> Wavy(std::size_t n, float phase) {
  std::vector<float> v(n);
  for (std::size_t k = 0; k < n; ++k)
    v[k] = 3 * std::sin(phase + 0.61f * static_cast<float>(k));
  return v;
}

TEST_P(ExecutorMath, TheSoftmaxesBackwardMatchTheReference) {
  constexpr int kRows = 5, kCols = 37;  // two lanes and a tail
  const std::vector<float> g = Wavy(kRows * kCols, 0.3f), x = Wavy(kRows * kCols, 1.1f);
  std::vector<float> prob(x.size()), logp(x.size());
  for (int r = 0; r < kRows; ++r) {
    double sum = 0;
    for (int c = 0; c < kCols; ++c) sum += std::exp(double{x[r * kCols + c]});
    for (int c = 0; c < kCols; ++c) {
      prob[r * kCols + c] = static_cast<float>(std::exp(double{x[r * kCols + c]}) / sum);
      logp[r * kCols + c] = static_cast<float>(x[r * kCols + c] - std::log(sum));
    }
  }
  const auto soft = RunOp(proto::OP_SOFTMAX_BACKWARD_ROWS, g, prob, {}, kRows);
  const auto log = RunOp(proto::OP_LOG_SOFTMAX_BACKWARD_ROWS, g, logp, {}, kRows);
  for (int r = 0; r < kRows; ++r) {
    double dot = 0, sum = 0;
    for (int c = 0; c < kCols; ++c) {
      dot += double{g[r * kCols + c]} * prob[r * kCols + c];
      sum += g[r * kCols + c];
    }
    for (int c = 0; c < kCols; ++c) {
      const int k = r * kCols + c;
      EXPECT_NEAR(soft[k], prob[k] * (g[k] - dot), 2e-6) << r << "," << c;
      EXPECT_NEAR(log[k], g[k] - std::exp(double{logp[k]}) * sum, 1e-5) << r << "," << c;
    }
  }
}

// layer_norm_rows (x, w, b -> y, mean, rstd) then its backward (g, x,
// mean, rstd, w -> gx, gw, gb) over [rows, cols], in one plan.
std::map<std::string, std::vector<float>> LayerNormPlan(
    const std::map<std::string, std::vector<float>>& values, std::int64_t rows,
    std::int64_t cols) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("layer-norm");
  const std::vector<std::pair<std::string, std::int64_t>> buffers = {
      {"x", rows * cols}, {"w", cols},    {"b", cols},    {"g", rows * cols},
      {"y", rows * cols}, {"mean", rows}, {"rstd", rows}, {"gx", rows * cols},
      {"gw", cols},       {"gb", cols}};
  std::map<std::string, std::uint32_t> id;
  std::uint64_t offset = 0;
  for (const auto& [name, n] : buffers) {
    id[name] = static_cast<std::uint32_t>(id.size());
    AddBuffer(e, id[name], offset, proto::F32, n);
    offset += static_cast<std::uint64_t>(4 * n);
  }
  std::map<std::string, HostTensor> inputs;
  for (const char* name : {"x", "w", "b", "g"}) {
    auto* in = e.add_inputs();
    in->set_name(name), in->set_buffer(id[name]);
    const auto n = static_cast<std::int64_t>(values.at(name).size());
    inputs[name] = HostTensor::FromFloats(proto::F32, {n}, values.at(name));
  }
  auto op = [&](std::uint32_t k, proto::Op kind, std::vector<const char*> in,
                std::vector<const char*> out) {
    auto* i = e.add_instructions();
    i->set_id(k), i->set_op(kind), i->set_engine(proto::VECTOR);
    i->set_m(rows), i->set_n(cols), i->set_scalar(1e-5);
    for (const char* name : in) i->add_inputs(id[name]);
    for (const char* name : out) i->add_outputs(id[name]);
    i->set_operand_count(static_cast<std::uint32_t>(in.size()));
    if (k > 0) i->add_deps(0);
  };
  op(0, proto::OP_LAYER_NORM_ROWS, {"x", "w", "b"}, {"y", "mean", "rstd"});
  op(1, proto::OP_LAYER_NORM_BACKWARD_ROWS, {"g", "x", "mean", "rstd", "w"},
     {"gx", "gw", "gb"});
  for (const char* name : {"y", "mean", "rstd", "gx", "gw", "gb"}) {
    auto* out = e.add_outputs();
    out->set_name(name), out->set_buffer(id[name]);
  }
  std::map<std::string, std::vector<float>> got;
  for (const auto& [name, t] : Executor(DeviceSpec::Default()).Run(e, inputs).outputs)
    got[name] = t.ToFloats();
  return got;
}

TEST_P(ExecutorMath, LayerNormAndItsBackwardMatchTheReference) {
  constexpr int kRows = 6, kCols = 37;
  std::map<std::string, std::vector<float>> v = {{"x", Wavy(kRows * kCols, 0.2f)},
                                                 {"w", Wavy(kCols, 0.9f)},
                                                 {"b", Wavy(kCols, 2.3f)},
                                                 {"g", Wavy(kRows * kCols, 1.7f)}};
  for (float& x : v["x"]) x += 5;  // a mean far from zero
  const auto got = LayerNormPlan(v, kRows, kCols);
  const auto &x = v["x"], &w = v["w"], &b = v["b"], &g = v["g"];
  std::vector<double> gw(kCols, 0), gb(kCols, 0);
  for (int r = 0; r < kRows; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < kCols; ++c) mean += x[r * kCols + c];
    mean /= kCols;
    for (int c = 0; c < kCols; ++c)
      var += (x[r * kCols + c] - mean) * (x[r * kCols + c] - mean);
    const double rstd = 1 / std::sqrt(var / kCols + 1e-5);
    EXPECT_NEAR(got.at("mean")[r], mean, 1e-6 * std::fabs(mean)) << r;
    EXPECT_NEAR(got.at("rstd")[r], rstd, 2e-6 * rstd) << r;
    std::vector<double> xhat(kCols), gxhat(kCols);
    double mean_gxhat = 0, mean_gxhat_xhat = 0;
    for (int c = 0; c < kCols; ++c) {
      const int k = r * kCols + c;
      xhat[c] = (x[k] - mean) * rstd;
      gxhat[c] = double{g[k]} * w[c];
      gw[c] += g[k] * xhat[c];
      gb[c] += g[k];
      mean_gxhat += gxhat[c] / kCols;
      mean_gxhat_xhat += gxhat[c] * xhat[c] / kCols;
      EXPECT_NEAR(got.at("y")[k], xhat[c] * w[c] + b[c], 2e-6) << r << "," << c;
    }
    for (int c = 0; c < kCols; ++c) {
      const double gx = rstd * (gxhat[c] - mean_gxhat - xhat[c] * mean_gxhat_xhat);
      EXPECT_NEAR(got.at("gx")[r * kCols + c], gx, 1e-5 * (1 + rstd)) << r << "," << c;
    }
  }
  for (int c = 0; c < kCols; ++c) {
    EXPECT_NEAR(got.at("gw")[c], gw[c], 1e-5) << c;
    EXPECT_NEAR(got.at("gb")[c], gb[c], 1e-5) << c;
  }
}

TEST_P(ExecutorMath, ARowsSumAddsLaneByLaneInTheLaneCountSet) {
  // 2^24 at 0 and -2^24 at 16 among ones: a lane holding both loses the
  // ones it adds between them (2^24 + 1 rounds to 2^24), so the row's sum
  // tells the lane count: 27 in 4 lanes, 29 in 8, 30 in 16 (15 in order).
  constexpr int kCols = 32;
  std::vector<float> x(kCols, 1.0f);
  x[0] = 16777216.0f, x[16] = -16777216.0f;
  const auto got = LayerNormPlan({{"x", x},
                                  {"w", std::vector<float>(kCols, 1.0f)},
                                  {"b", std::vector<float>(kCols, 0.0f)},
                                  {"g", std::vector<float>(kCols, 1.0f)}},
                                 1, kCols);
  const std::map<int, float> sum = {{4, 27.0f}, {8, 29.0f}, {16, 30.0f}};
  EXPECT_EQ(got.at("mean")[0], sum.at(GetParam()) / kCols);
}

TEST(LaneWidth, ElementwiseResultsAreTheSameInEveryLaneCount) {
  std::vector<float> x = Grid(-20, 20, 0.0173f);
  for (float v : {kInf, -kInf, std::nanf(""), 88.7f, -87.5f}) x.push_back(v);
  const std::vector<float> g = Wavy(x.size(), 0.4f);
  std::map<int, std::vector<std::vector<float>>> by_width;
  for (int width : {4, 8, 16}) {
    SetLaneWidth(width);
    by_width[width] = {RunOp(proto::OP_EXP, x), RunOp(proto::OP_GELU_EXACT, x),
                       RunOp(proto::OP_GELU_EXACT_BACKWARD, g, x)};
  }
  SetLaneWidth(0);
  for (int width : {8, 16}) {
    for (std::size_t op = 0; op < 3; ++op) {
      const auto &want = by_width[4][op], &got = by_width[width][op];
      ASSERT_EQ(got.size(), want.size());
      // Bit for bit: NaN compares unequal to itself.
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "op " << op << " in " << width << " lanes differs from 4 lanes";
    }
  }
}

// One fused instruction over x's elements: x + bias, masked_fill(-5) where
// the mask is set (no masked_fill when the mask is empty), times 0.5, exact
// GELU; the bias and the mask repeat over x.
std::vector<float> RunChain(const std::vector<float>& x, const std::vector<float>& bias,
                            const std::vector<std::uint8_t>& mask) {
  const auto n = static_cast<std::int64_t>(x.size());
  OneInstruction plan(proto::OP_FUSED, n);
  proto::Instruction& i = plan.instruction();
  i.set_engine(proto::SCALAR);
  auto sub = [&](proto::Op op, std::vector<std::uint32_t> ids, double scalar) {
    auto* f = i.add_fused();
    f->set_op(op), f->set_scalar(scalar), f->set_elements(n);
    for (auto id : ids) f->add_inputs(id);
  };
  plan.Bind("x", 0, 0, x);
  plan.Bind("bias", 2, 8 * n, bias);
  sub(proto::OP_ADD, {0, 2}, 0);
  if (!mask.empty()) {
    plan.BindMask("mask", 3, 8 * n + 4 * bias.size(), mask);
    sub(proto::OP_MASKED_FILL, {kFusedPrevious, 3}, -5);
  }
  sub(proto::OP_SCALE, {kFusedPrevious}, 0.5);
  sub(proto::OP_GELU_EXACT, {kFusedPrevious}, 0);
  return plan.Run();
}

TEST_P(ExecutorMath, AFusedChainGivesTheSameElementsInBlocksAsOneByOne) {
  // (n, bias period, mask period): blocks of 4096 with a partial last one,
  // of a multiple of a period that does not divide 4096, of a period longer
  // than 4096, and periods no block length fits (the chain in one block);
  // fused_blocks_test.cc checks which.
  using Case = std::tuple<std::size_t, std::size_t, std::size_t>;
  for (const auto& [n, period, mask_period] : std::vector<Case>{{40960, 128, 8192},
                                                                {42624, 128, 0},
                                                                {21000, 3000, 0},
                                                                {36000, 3000, 9000},
                                                                {36000, 3000, 7200},
                                                                {1000, 10, 100}}) {
    const std::vector<float> x = Wavy(n, 0.3f), bias = Wavy(period, 1.1f);
    std::vector<std::uint8_t> mask(mask_period);
    for (std::size_t k = 0; k < mask_period; ++k) mask[k] = k % 7 == 3;
    const std::vector<float> y = RunChain(x, bias, mask);
    // The chain's value before GELU, exactly (add, select and halving
    // round the same way anywhere), then GELU alone over it.
    std::vector<float> pre(n);
    for (std::size_t k = 0; k < n; ++k) {
      const bool masked = mask_period > 0 && mask[k % mask_period];
      pre[k] = (masked ? -5.0f : x[k] + bias[k % period]) * 0.5f;
    }
    const std::vector<float> want = RunOp(proto::OP_GELU_EXACT, pre);
    ASSERT_EQ(y.size(), n);
    for (std::size_t k = 0; k < n; ++k) {
      ASSERT_EQ(y[k], want[k]) << "n " << n << ", period " << period << ", mask period "
                               << mask_period << ", element " << k;
    }
  }
}

TEST(LaneWidth, IsTheCpusUntilSetAndRefusesOtherCounts) {
  const int cpu = LaneWidth();
  EXPECT_TRUE(cpu == 4 || cpu == 8 || cpu == 16) << cpu;
#if NEURON_KERNEL_CLONES_BUILT
  EXPECT_EQ(cpu, __builtin_cpu_supports("x86-64-v4")   ? 16
                 : __builtin_cpu_supports("x86-64-v3") ? 8
                                                       : 4);
#endif
  SetLaneWidth(4);
  EXPECT_EQ(LaneWidth(), 4);
  try {
    SetLaneWidth(12);
    ADD_FAILURE() << "12 lanes accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("4, 8 or 16 lanes (0: the CPU's), not 12"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(LaneWidth(), 4);  // unchanged by the refused count
  SetLaneWidth(0);
  EXPECT_EQ(LaneWidth(), cpu);
}

}  // namespace
}  // namespace neuron::runtime
