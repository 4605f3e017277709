// The lanes' exponential for non-positive arguments (vector_math.h)
// against the general one: bit for bit over a sweep of every sign-bit
// float pattern from -0 to -inf, in each lane count, and its edges.
#include "vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace neuron::runtime::kernels::lanes {
namespace {

float FromBits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
std::uint32_t Bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Fills lanes from `next()`, and checks each lane of ExpOfNonPositive
// against Exp's; the number of lanes that differ.
template <std::size_t L, typename Next>
std::size_t Mismatches(std::size_t vectors, Next next) {
  using V = typename Width<L>::V;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < vectors; ++i) {
    V x;
    for (std::size_t l = 0; l < L; ++l) x[l] = next();
    const V want = Exp(x), got = ExpOfNonPositive(x);
    for (std::size_t l = 0; l < L; ++l) {
      const bool same =
          std::isnan(want[l]) ? std::isnan(got[l]) : Bits(want[l]) == Bits(got[l]);
      if (!same) {
        ADD_FAILURE() << L << " lanes: x " << x[l] << " (bits " << std::hex << Bits(x[l])
                      << ") gives " << got[l] << ", Exp " << want[l];
        if (++bad > 10) return bad;
      }
    }
  }
  return bad;
}

template <std::size_t L>
void SweepNonPositive() {
  // Every 251st pattern from 0x80000000 (-0) to 0xff800000 (-inf).
  constexpr std::uint32_t kStep = 251, kFirst = 0x80000000u, kLast = 0xff800000u;
  std::uint32_t bits = kFirst;
  const std::size_t count = (kLast - kFirst) / kStep + 1;
  auto next = [&] {
    const float f = FromBits(bits);
    bits = bits + kStep > kLast || bits + kStep < bits ? kFirst : bits + kStep;
    return f;
  };
  EXPECT_EQ(Mismatches<L>(count / L + 1, next), 0u);
  // The edges: both zeros, around the clamp at -87, -inf, NaN.
  const float edges[] = {0.0f,
                         -0.0f,
                         -87.0f,
                         std::nextafter(-87.0f, 0.0f),
                         std::nextafter(-87.0f, -100.0f),
                         -86.99f,
                         -1e-30f,
                         -std::numeric_limits<float>::denorm_min(),
                         -std::numeric_limits<float>::max(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
  std::size_t e = 0;
  EXPECT_EQ(Mismatches<L>(sizeof edges / sizeof edges[0],
                          [&] { return edges[e++ % (sizeof edges / sizeof edges[0])]; }),
            0u);
}

TEST(ExpOfNonPositive, IsExpBitForBitFromZeroToMinusInfinity) {
  SweepNonPositive<4>();
  SweepNonPositive<8>();
  SweepNonPositive<16>();
}

TEST(ExpOfNonPositive, IsZeroBelowTheClampOneAboveZeroAndNanForNan) {
  using V = Width<8>::V;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const V x = {-87.5f, -1e30f, -std::numeric_limits<float>::infinity(), nan,
               1.0f,   1e30f,  std::numeric_limits<float>::infinity(),  -87.0f};
  const V y = ExpOfNonPositive(x);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(Bits(y[l]), 0u) << "lane " << l;
  EXPECT_TRUE(std::isnan(y[3]));
  // A positive x is outside the contract: e^0, never an undefined value.
  for (int l = 4; l < 7; ++l) EXPECT_EQ(y[l], 1.0f) << "lane " << l;
  EXPECT_NEAR(y[7], std::exp(-87.0), 1e-6 * std::exp(-87.0));
  EXPECT_GE(y[7], std::numeric_limits<float>::min());  // normal, never subnormal
}

}  // namespace
}  // namespace neuron::runtime::kernels::lanes
