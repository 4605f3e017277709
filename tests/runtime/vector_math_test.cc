// The lanes' exponential for non-positive arguments (vector_math.h)
// against the general one, bit for bit: over every 251st float from -0
// down to the largest finite negative, densely around each point where
// they could part (where n, x's multiple of ln 2, rounds the other way,
// and the clamp at -87), and at the edges; in each lane count, and as the
// kernels' x86-64-v3 and v4 clones compile them (multiply-adds fused)
// where the CPU runs those.
#include "vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

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

// The inputs, padded with -0 to a whole number of 16 lanes.
std::vector<float> Inputs() {
  std::vector<float> xs;
  constexpr std::uint32_t kMinusZero = 0x80000000u, kMinusMax = 0xff7fffffu;
  for (std::uint64_t b = kMinusZero; b <= kMinusMax; b += 251)
    xs.push_back(FromBits(static_cast<std::uint32_t>(b)));
  // 4096 floats either side of each x where x * log2(e) is -j - 0.5, and
  // of -87.
  std::vector<float> parting;
  for (int j = 0; j <= 125; ++j) parting.push_back((-j - 0.5f) / 1.44269504088896341f);
  parting.push_back(-87.0f);
  for (const float p : parting) {
    for (int k = -4096; k <= 4096; ++k) {
      const float x =
          FromBits(static_cast<std::uint32_t>(static_cast<std::int64_t>(Bits(p)) + k));
      if (x <= 0.0f) xs.push_back(x);
    }
  }
  for (const float edge :
       {0.0f, -0.0f, -std::numeric_limits<float>::denorm_min(),
        -std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    xs.push_back(edge);
  }
  while (xs.size() % 16 != 0) xs.push_back(-0.0f);
  return xs;
}

// Exp and ExpOfNonPositive of each x, L lanes at a time.
template <std::size_t L>
NEURON_LANES_INLINE void BothOver(const std::vector<float>& xs, std::vector<float>& want,
                                  std::vector<float>& got) {
  using V = typename Width<L>::V;
  want.resize(xs.size());
  got.resize(xs.size());
  for (std::size_t i = 0; i < xs.size(); i += L) {
    V x;
    std::memcpy(&x, xs.data() + i, sizeof x);
    const V w = Exp(x), g = ExpOfNonPositive(x);
    std::memcpy(want.data() + i, &w, sizeof w);
    std::memcpy(got.data() + i, &g, sizeof g);
  }
}

using Both = void (*)(const std::vector<float>&, std::vector<float>&,
                      std::vector<float>&);
template <std::size_t L>
void BothDefault(const std::vector<float>& xs, std::vector<float>& want,
                 std::vector<float>& got) {
  BothOver<L>(xs, want, got);
}
#if NEURON_KERNEL_CLONES_BUILT
__attribute__((target("arch=x86-64-v3"))) void BothV3(const std::vector<float>& xs,
                                                      std::vector<float>& want,
                                                      std::vector<float>& got) {
  BothOver<8>(xs, want, got);
}
__attribute__((target("arch=x86-64-v4"))) void BothV4(const std::vector<float>& xs,
                                                      std::vector<float>& want,
                                                      std::vector<float>& got) {
  BothOver<16>(xs, want, got);
}
#endif

// The ways this CPU can run the two: each lane count in the default
// target, and the clones' instruction sets it has.
std::vector<std::pair<std::string, Both>> Variants() {
  std::vector<std::pair<std::string, Both>> v = {{"4 lanes", &BothDefault<4>},
                                                 {"8 lanes", &BothDefault<8>},
                                                 {"16 lanes", &BothDefault<16>}};
#if NEURON_KERNEL_CLONES_BUILT
  if (__builtin_cpu_supports("x86-64-v3")) v.emplace_back("x86-64-v3, 8 lanes", &BothV3);
  if (__builtin_cpu_supports("x86-64-v4")) v.emplace_back("x86-64-v4, 16 lanes", &BothV4);
#endif
  return v;
}

TEST(ExpOfNonPositive, IsExpBitForBitFromZeroToMinusInfinity) {
  const std::vector<float> xs = Inputs();
  ASSERT_GT(xs.size(), 9'000'000u);
  std::vector<float> want, got;
  for (const auto& [name, both] : Variants()) {
    both(xs, want, got);
    int bad = 0;
    for (std::size_t i = 0; i < xs.size() && bad < 10; ++i) {
      const bool same =
          std::isnan(want[i]) ? std::isnan(got[i]) : Bits(want[i]) == Bits(got[i]);
      if (!same) {
        ++bad;
        ADD_FAILURE() << name << ": x " << xs[i] << " (bits " << std::hex << Bits(xs[i])
                      << ") gives " << got[i] << ", Exp " << want[i];
      }
    }
  }
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
