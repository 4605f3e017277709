// Reduction kernels and half-precision conversions against naive references.
#include "neuron/collectives/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "neuron/collectives/half.h"
#include "dtype_values.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {
namespace {

TEST(Half, EveryBitPatternRoundTrips) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << bits;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << "half bits " << bits << " -> " << f;
    }
    const float b = BFloat16ToFloat(h);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(b)))) << bits;
    } else {
      ASSERT_EQ(FloatToBFloat16(b), h) << "bfloat16 bits " << bits;
    }
  }
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.2f, -11)), 0x3c01);      // above tie
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);                           // largest
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                           // -> inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);              // subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);              // tie -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16(INFINITY), 0x7f80);
}

using testing::Encode;

// The naive reference: exact arithmetic on small integers, in double.
double Reference(ReduceOp op, const std::vector<double>& column, bool is_bool) {
  double acc = column[0];
  for (std::size_t k = 1; k < column.size(); ++k) {
    const double v = column[k];
    const auto ia = static_cast<std::int64_t>(acc), ib = static_cast<std::int64_t>(v);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc = is_bool ? double(ia || ib) : acc + v; break;
      case ReduceOp::kProduct: acc = is_bool ? double(ia && ib) : acc * v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc = static_cast<double>(ia & ib); break;
      case ReduceOp::kBor: acc = static_cast<double>(ia | ib); break;
      case ReduceOp::kBxor: acc = static_cast<double>(ia ^ ib); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    acc = std::trunc(acc / static_cast<double>(column.size()));
  }
  return acc;
}

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                           DataType::kInt32, DataType::kInt64, DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                         ReduceOp::kMax, ReduceOp::kAvg, ReduceOp::kBand,
                         ReduceOp::kBor, ReduceOp::kBxor};

using testing::Supported;

TEST(Reduce, EveryDtypeAndOpMatchesTheNaiveReference) {
  std::mt19937 rng(42);
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (!Supported(type, op)) continue;
      for (std::size_t n : {1, 2, 3, 5}) {
        const std::size_t count = 37;
        const bool is_bool = type == DataType::kBool;
        const bool is_unsigned = type == DataType::kUInt8 || is_bool;
        // Small integers keep every result exact in every dtype; products
        // stay within int8 range.
        std::uniform_int_distribution<int> dist(is_unsigned ? 0 : -2, is_bool ? 1 : 2);
        std::vector<std::vector<double>> inputs(n, std::vector<double>(count));
        for (auto& in : inputs) for (auto& v : in) v = dist(rng);
        std::vector<std::vector<unsigned char>> encoded;
        std::vector<const void*> pointers;
        for (auto& in : inputs) encoded.push_back(Encode(type, in));
        for (auto& e : encoded) pointers.push_back(e.data());
        std::vector<double> expected(count);
        for (std::size_t i = 0; i < count; ++i) {
          std::vector<double> column;
          for (auto& in : inputs) column.push_back(in[i]);
          expected[i] = Reference(op, column, is_bool);
        }
        std::vector<unsigned char> out(count * ElementSize(type));
        ReduceInputs(type, op, pointers.data(), n, out.data(), count, n);
        const bool float_avg = op == ReduceOp::kAvg && IsFloatingPoint(type);
        if (!float_avg) {
          EXPECT_EQ(out, Encode(type, expected))
              << Name(type) << " " << Name(op) << " over " << n << " inputs";
        }
        // Pairwise accumulation gives the same on these exact values.
        std::vector<unsigned char> pairwise = encoded[0];
        for (std::size_t k = 1; k < n; ++k) {
          Accumulate(type, op, pairwise.data(), encoded[k].data(), count);
        }
        if (op == ReduceOp::kAvg) FinishAverage(type, pairwise.data(), count, n);
        EXPECT_EQ(pairwise, out) << Name(type) << " " << Name(op) << " n=" << n;
      }
    }
  }
}

TEST(Reduce, FloatAverageDividesOnce) {
  const std::vector<double> a = {1, 2, 3}, b = {2, 2, 4}, c = {4, 5, 6};
  for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                        DataType::kBFloat16}) {
    auto ea = Encode(type, a), eb = Encode(type, b), ec = Encode(type, c);
    const void* in[] = {ea.data(), eb.data(), ec.data()};
    std::vector<unsigned char> out(3 * ElementSize(type));
    ReduceInputs(type, ReduceOp::kAvg, in, 3, out.data(), 3, 3);
    // The sum is exact; the one division happens in the accumulator type.
    const bool wide = type == DataType::kFloat64;
    const double third7 = wide ? 7.0 / 3 : double(7.0f / 3);
    const double third13 = wide ? 13.0 / 3 : double(13.0f / 3);
    EXPECT_EQ(out, Encode(type, {third7, 3, third13})) << Name(type);
  }
}

TEST(Reduce, HalfTypesAccumulateInFloat32) {
  // 256 + 1 + 1 in bfloat16: each pairwise step rounds 257 back to 256, while
  // accumulating in float32 gives 258, which bfloat16 represents exactly.
  const auto a = Encode(DataType::kBFloat16, {256}), one = Encode(DataType::kBFloat16, {1});
  const void* in[] = {a.data(), one.data(), one.data()};
  std::vector<unsigned char> out(2);
  ReduceInputs(DataType::kBFloat16, ReduceOp::kSum, in, 3, out.data(), 1, 0);
  EXPECT_EQ(out, Encode(DataType::kBFloat16, {258}));
  auto pairwise = a;
  Accumulate(DataType::kBFloat16, ReduceOp::kSum, pairwise.data(), one.data(), 1);
  Accumulate(DataType::kBFloat16, ReduceOp::kSum, pairwise.data(), one.data(), 1);
  EXPECT_EQ(pairwise, Encode(DataType::kBFloat16, {256}));
}

TEST(Reduce, IntegersWrapAndMinMaxPropagateNan) {
  std::int8_t a[] = {127, -128}, b[] = {1, -1};
  Accumulate(DataType::kInt8, ReduceOp::kSum, a, b, 2);
  EXPECT_EQ(a[0], -128);
  EXPECT_EQ(a[1], 127);
  float x[] = {1.0f, std::nanf("")}, y[] = {std::nanf(""), 2.0f};
  Accumulate(DataType::kFloat32, ReduceOp::kMin, x, y, 2);
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_TRUE(std::isnan(x[1]));
}

TEST(Reduce, UnsupportedPairsNameOpAndDtype) {
  try {
    CheckReducible(DataType::kFloat32, ReduceOp::kBand, "allreduce");
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce: reduce op band is not defined for "
                                         "float32"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(CheckReducible(DataType::kBool, ReduceOp::kAvg, "allreduce"), InvalidUsage);
  EXPECT_NO_THROW(CheckReducible(DataType::kBool, ReduceOp::kBxor, "allreduce"));
}

}  // namespace
}  // namespace neuron::collectives
