// IEEE binary16 and bfloat16 conversions, round to nearest even, with
// infinities and NaNs preserved (NaNs are made quiet). Inline: the
// reduction kernels convert every element.
#pragma once

#include <cstdint>
#include <cstring>

namespace neuron::runtime {

namespace half_detail {

inline std::uint32_t Bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

inline float FromBits(std::uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

// Rounds `value >> shift` to nearest, ties to even.
inline std::uint32_t ShiftRoundEven(std::uint32_t value, std::uint32_t shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

}  // namespace half_detail

inline float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return half_detail::FromBits(sign | 0x7f800000 | (mant << 13));
  if (exp != 0) return half_detail::FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return half_detail::FromBits(sign);
  // Subnormal: normalise the mantissa.
  std::uint32_t e = 113;  // exponent of 2^-14 in float32, minus the shifts below
  while ((mant & 0x400) == 0) {
    mant <<= 1;
    --e;
  }
  return half_detail::FromBits(sign | (e << 23) | ((mant & 0x3ff) << 13));
}

inline std::uint16_t FloatToHalf(float value) {
  const std::uint32_t x = half_detail::Bits(value);
  const std::uint32_t sign = (x >> 16) & 0x8000;
  const std::uint32_t exp = (x >> 23) & 0xff;
  const std::uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) {  // inf, or NaN made quiet
    return static_cast<std::uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  }
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<std::uint16_t>(sign);
    const std::uint32_t full = mant | 0x800000;
    return static_cast<std::uint16_t>(sign | half_detail::ShiftRoundEven(full, 14 - e));
  }
  // A carry out of the mantissa correctly bumps the exponent (up to inf).
  const std::uint32_t rounded = half_detail::ShiftRoundEven((std::uint32_t(e) << 23) | mant, 13);
  return static_cast<std::uint16_t>(sign | rounded);
}

inline float BFloat16ToFloat(std::uint16_t bits) { return half_detail::FromBits(std::uint32_t(bits) << 16); }

inline std::uint16_t FloatToBFloat16(float value) {
  const std::uint32_t x = half_detail::Bits(value);
  if ((x & 0x7fffffff) > 0x7f800000) {  // NaN: keep it a NaN, quiet
    return static_cast<std::uint16_t>((x >> 16) | 0x40);
  }
  return static_cast<std::uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace neuron::runtime
