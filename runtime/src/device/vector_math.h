// Float math over lanes of 4, 8 or 16 floats (GCC/Clang vector
// extensions), for the executor's elementwise kernels: branch-free, so a
// loop over a tensor runs a vector of elements per step instead of calling
// libm per element.
//
//   Exp: e^x within 1 ulp of libm's expf over [-87, 88.7] (Cephes' range
//        reduction and polynomial); 0 below (results under 1.7e-38: no
//        subnormal is ever made, which would cost the CPU a microcode assist
//        per lane), +inf above, NaN stays NaN.
//   ExpOfNonPositive: Exp's value for x <= 0 in fewer instructions.
//   Erf: the rational approximation Eigen and XLA use for float32 (an odd
//        polynomial of degree 13 over an even one of degree 8, the input
//        clamped to [-4, 4], beyond which erf is +-1 in float), within
//        3.7e-7 of erf, with no exponential (Abramowitz & Stegun 7.1.26,
//        PyTorch's vectorized form, is within 1.5e-7 but takes one).
//   GeluExactDerivative: exact GELU's derivative, erf by A&S 7.1.26 sharing
//        its exponential with the normal density's.
//
// Every element goes through the same lanes code, the tail included (Map
// pads it), so an elementwise result depends neither on an element's
// position nor on the lane count; a row's sum or maximum adds in lanes, so
// its rounding depends on the lane count.
//
// The lane count is the widest vector the running clone holds in one
// register (`Dispatch`): GCC 12 turns every comparison and select on a
// vector wider than the registers (16 floats under AVX2) into one scalar
// compare and branch per lane, which made these kernels 2-6x slower than
// the vector code on AVX2 CPUs (exp alone 5.5x).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "neuron/runtime/device/lane_width.h"

namespace neuron::runtime::kernels::lanes {

// The vector of L floats, and the lane count of a vector type.
template <std::size_t L>
struct Width {
  static_assert(L == 4 || L == 8 || L == 16, "lanes of 4, 8 or 16 floats");
  typedef float V __attribute__((vector_size(L * sizeof(float))));
};
template <typename V>
constexpr std::size_t kCount = sizeof(V) / sizeof(float);
// The int32 vector of V's lanes (what comparing two Vs makes).
template <typename V>
using IntOf = decltype(V{} < V{});

#define NEURON_LANES_INLINE __attribute__((always_inline)) inline
// After a lambda's parameters, for the lambdas handed to Map, Map2 and
// Dispatch: inlined into each clone, a V never crosses a call (whose ABI
// for vector arguments would depend on the clone's instruction set).
#define NEURON_LANES_INLINE_LAMBDA __attribute__((always_inline))

// On a kernel function: also compiled for x86-64-v4 (AVX-512) and v3 (AVX2,
// FMA), the best the CPU has chosen at load time.
#if NEURON_KERNEL_CLONES_BUILT
#define NEURON_KERNEL_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NEURON_KERNEL_CLONES
#endif

// f(Width<L>{}) for the lane count L the kernels use (lane_width.h): f's body, a generic
// lambda marked NEURON_LANES_INLINE_LAMBDA, is compiled for each count inside the calling
// clone.
template <typename F>
NEURON_LANES_INLINE auto Dispatch(F f) {
  switch (LaneWidth()) {
    case 16:
      return f(Width<16>{});
    case 8:
      return f(Width<8>{});
    default:
      return f(Width<4>{});
  }
}

template <typename V>
NEURON_LANES_INLINE V Splat(float f) {
  return V{} + f;
}

// e^c / 2^n for n the integer nearest c / ln2: c = n ln2 + r, |r| <= ln2 /
// 2, ln2 in two parts keeping r exact, and e^r by Cephes' polynomial. Exp
// and ExpOfNonPositive share it, so their values agree bit for bit.
template <typename V>
NEURON_LANES_INLINE V ExpOfReduced(V c, V n) {
  V r = c - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V p = Splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

template <typename V>
NEURON_LANES_INLINE V Exp(V x) {
  using VI = IntOf<V>;
  const V hi = Splat<V>(88.7228394f), lo = Splat<V>(-87.0f);
  V c = x != x ? Splat<V>(0.0f) : x;  // NaN lanes: defined arithmetic, result set below
  c = c < lo ? lo : c;
  c = c > hi ? hi : c;
  const V t = c * 1.44269504088896341f;
  const VI ni =
      __builtin_convertvector(t + (t >= 0 ? Splat<V>(0.5f) : Splat<V>(-0.5f)), VI);
  const V n = __builtin_convertvector(ni, V);
  const V p = ExpOfReduced(c, n);
  // 2^n as two factors: n reaches 128 at the top of the range.
  const VI h = ni >> 1;
  V y = p * reinterpret_cast<V>((h + 127) << 23) *
        reinterpret_cast<V>((ni - h + 127) << 23);
  y = x < lo ? Splat<V>(0.0f) : y;
  y = x > hi ? Splat<V>(std::numeric_limits<float>::infinity()) : y;
  return x != x ? x : y;
}

// Exp for x <= 0 (softmax's x - max, GELU's -x^2 / 2): the same value bit
// for bit, 0 below -87 and NaN for NaN, in about two thirds of Exp's
// instructions: no upper clamp, rounding in one direction, and 2^n in one
// factor (n >= -126 here, and e^x >= 1.6e-38 is normal). A positive x
// gives 1 (e^0), never an undefined conversion.
template <typename V>
NEURON_LANES_INLINE V ExpOfNonPositive(V x) {
  using VI = IntOf<V>;
  const V lo = Splat<V>(-87.0f);
  V c = x > lo ? x : lo;  // NaN lanes: defined arithmetic, result set below
  c = c < 0.0f ? c : Splat<V>(0.0f);
  const V t = c * 1.44269504088896341f;
  const VI ni = __builtin_convertvector(t - 0.5f, VI);  // t <= 0: rounds to nearest
  const V n = __builtin_convertvector(ni, V);
  const V p = ExpOfReduced(c, n);
  const V y = p * reinterpret_cast<V>((ni + 127) << 23);
  return x >= lo ? y : (x != x ? x : Splat<V>(0.0f));
}

template <typename V>
NEURON_LANES_INLINE V Erf(V x) {
  V c = x > 4.0f ? Splat<V>(4.0f) : x;  // erf is +-1 in float beyond; NaN stays
  c = c < -4.0f ? Splat<V>(-4.0f) : c;
  const V c2 = c * c;
  V p = Splat<V>(-2.72614225801306e-10f);
  p = p * c2 + 2.77068142495902e-08f;
  p = p * c2 - 2.10102402082508e-06f;
  p = p * c2 - 5.69250639462346e-05f;
  p = p * c2 - 7.34990630326855e-04f;
  p = p * c2 - 2.95459980854025e-03f;
  p = p * c2 - 1.60960333262415e-02f;
  V q = Splat<V>(-1.45660718464996e-05f);
  q = q * c2 - 2.13374055278905e-04f;
  q = q * c2 - 1.68282697438203e-03f;
  q = q * c2 - 7.37332916720468e-03f;
  q = q * c2 - 1.42647390514189e-02f;
  V e = c * p / q;
  e = e > 1.0f ? Splat<V>(1.0f) : e;
  return e < -1.0f ? Splat<V>(-1.0f) : e;
}

// d/dx of x * Phi(x) (exact GELU): Phi(x) + x * phi(x), with erf by
// Abramowitz & Stegun 7.1.26 (within 1.5e-7; PyTorch's vectorized erf),
// whose exponential e^(-x^2 / 2) is phi's own: one exponential and one
// division, where Erf and a separate Exp would take a division, two
// polynomials and the exponential.
template <typename V>
NEURON_LANES_INLINE V GeluExactDerivative(V x) {
  const V a = (x < 0.0f ? -x : x) * 0.7071067811865476f;  // |x| / sqrt(2)
  const V t = 1.0f / (1.0f + 0.3275911f * a);
  V p = Splat<V>(1.061405429f);
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const V e = ExpOfNonPositive(-0.5f * x * x);
  const V erf_a = 1.0f - p * t * e;  // erf(|x| / sqrt(2))
  const V cdf = 0.5f + 0.5f * (x < 0.0f ? -erf_a : erf_a);
  return cdf + x * (0.3989422804014327f * e);
}

// Each lane combined with the one half the lanes away, then a quarter, ...,
// then 1: lane 0 ends with all combined, in log2(lanes) dependent steps.
template <typename V, typename Op>
NEURON_LANES_INLINE V Fold(V v, Op op) {
  using VI = IntOf<V>;
  if constexpr (kCount<V> == 16) {
    v = op(v, __builtin_shuffle(
                  v, VI{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    v = op(v, __builtin_shuffle(
                  v, VI{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
    v = op(v, __builtin_shuffle(
                  v, VI{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
    return op(v, __builtin_shuffle(
                     v, VI{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
  } else if constexpr (kCount<V> == 8) {
    v = op(v, __builtin_shuffle(v, VI{4, 5, 6, 7, 0, 1, 2, 3}));
    v = op(v, __builtin_shuffle(v, VI{2, 3, 0, 1, 6, 7, 4, 5}));
    return op(v, __builtin_shuffle(v, VI{1, 0, 3, 2, 5, 4, 7, 6}));
  } else {
    v = op(v, __builtin_shuffle(v, VI{2, 3, 0, 1}));
    return op(v, __builtin_shuffle(v, VI{1, 0, 3, 2}));
  }
}

// The sum of v's lanes.
template <typename V>
NEURON_LANES_INLINE float HorizontalSum(V v) {
  return Fold(v, [](V a, V b) NEURON_LANES_INLINE_LAMBDA { return a + b; })[0];
}

// The largest of v's lanes (none NaN).
template <typename V>
NEURON_LANES_INLINE float HorizontalMax(V v) {
  return Fold(v, [](V a, V b) NEURON_LANES_INLINE_LAMBDA { return a > b ? a : b; })[0];
}

// out[i] = f(a[i]) for i < n, a V at a time.
template <typename V, typename F>
NEURON_LANES_INLINE void Map(const float* a, float* out, std::size_t n, F f) {
  std::size_t i = 0;
  for (; i + kCount<V> <= n; i += kCount<V>) {
    V v;
    std::memcpy(&v, a + i, sizeof(v));
    v = f(v);
    std::memcpy(out + i, &v, sizeof(v));
  }
  if (i == n) return;
  V v{};
  std::memcpy(&v, a + i, (n - i) * sizeof(float));
  v = f(v);
  std::memcpy(out + i, &v, (n - i) * sizeof(float));
}

// out[i] = f(a[i], b[i]) for i < n.
template <typename V, typename F>
NEURON_LANES_INLINE void Map2(const float* a, const float* b, float* out, std::size_t n,
                              F f) {
  std::size_t i = 0;
  for (; i + kCount<V> <= n; i += kCount<V>) {
    V u, v;
    std::memcpy(&u, a + i, sizeof(u));
    std::memcpy(&v, b + i, sizeof(v));
    u = f(u, v);
    std::memcpy(out + i, &u, sizeof(u));
  }
  if (i == n) return;
  V u{}, v{};
  std::memcpy(&u, a + i, (n - i) * sizeof(float));
  std::memcpy(&v, b + i, (n - i) * sizeof(float));
  u = f(u, v);
  std::memcpy(out + i, &u, (n - i) * sizeof(float));
}

// The sum of a[0..n), lane by lane then across the lanes.
template <typename V>
NEURON_LANES_INLINE float Sum(const float* a, std::size_t n) {
  V s{};
  std::size_t i = 0;
  for (; i + kCount<V> <= n; i += kCount<V>) {
    V v;
    std::memcpy(&v, a + i, sizeof(v));
    s += v;
  }
  float total = HorizontalSum(s);
  for (; i < n; ++i) total += a[i];
  return total;
}

// The sum of f(a[i], b[i]) for i < n, lane by lane then across the lanes
// (the tail's padding lanes add nothing, whatever f makes of them).
template <typename V, typename F>
NEURON_LANES_INLINE float SumOf2(const float* a, const float* b, std::size_t n, F f) {
  V s{};
  std::size_t i = 0;
  for (; i + kCount<V> <= n; i += kCount<V>) {
    V u, v;
    std::memcpy(&u, a + i, sizeof(u));
    std::memcpy(&v, b + i, sizeof(v));
    s += f(u, v);
  }
  if (i < n) {
    IntOf<V> lane{};
    for (std::size_t k = 0; k < kCount<V>; ++k) lane[k] = static_cast<std::int32_t>(k);
    V u{}, v{};
    std::memcpy(&u, a + i, (n - i) * sizeof(float));
    std::memcpy(&v, b + i, (n - i) * sizeof(float));
    s += lane < static_cast<std::int32_t>(n - i) ? f(u, v) : Splat<V>(0.0f);
  }
  return HorizontalSum(s);
}

// The largest of a[0..n) (n > 0), NaNs skipped; -inf when every one is NaN.
template <typename V>
NEURON_LANES_INLINE float Max(const float* a, std::size_t n) {
  V m = Splat<V>(-std::numeric_limits<float>::infinity());
  std::size_t i = 0;
  for (; i + kCount<V> <= n; i += kCount<V>) {
    V v;
    std::memcpy(&v, a + i, sizeof(v));
    m = v > m ? v : m;
  }
  float best = HorizontalMax(m);
  for (; i < n; ++i) best = a[i] > best ? a[i] : best;
  return best;
}

}  // namespace neuron::runtime::kernels::lanes
