#include "strided_copy.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace neuron::runtime::detail {
namespace {

// `bytes` contiguous bytes; whole 64-byte chunks as fixed-size copies the
// compiler makes vector moves (a head's 32 floats are two), the rest by
// memcpy.
inline void CopyBlock(const std::uint8_t* in, std::uint8_t* out, std::size_t bytes) {
  if (bytes % 64 != 0 || bytes > 512) {
    std::memcpy(out, in, bytes);
    return;
  }
  for (std::size_t b = 0; b < bytes; b += 64) std::memcpy(out + b, in + b, 64);
}

// Calls f(std::integral_constant<std::size_t, W>()) for a width W of 1, 2,
// 4 or 8 bytes, so f copies fixed-size elements; false for other widths.
template <typename F>
bool ByWidth(std::size_t width, F f) {
  switch (width) {
    case 1:
      return f(std::integral_constant<std::size_t, 1>()), true;
    case 2:
      return f(std::integral_constant<std::size_t, 2>()), true;
    case 4:
      return f(std::integral_constant<std::size_t, 4>()), true;
    case 8:
      return f(std::integral_constant<std::size_t, 8>()), true;
    default:
      return false;
  }
}

// `run` elements of `width` bytes, `in_step` and `out_step` elements apart.
void CopyRun(const std::uint8_t* in, std::uint8_t* out, std::size_t width,
             std::int64_t run, std::int64_t in_step, std::int64_t out_step) {
  const bool fixed = ByWidth(width, [&](auto w) {
    for (std::int64_t e = 0; e < run; ++e)
      std::memcpy(out + e * out_step * w, in + e * in_step * w, w);
  });
  if (fixed) return;
  for (std::int64_t e = 0; e < run; ++e)
    std::memcpy(out + e * out_step * width, in + e * in_step * width, width);
}

// rows x run elements of `width` bytes, input element (r, c) at
// c * in_step + r (the input is contiguous down the rows: a transpose) and
// output element at r * out_row + c; in square tiles, so the lines read
// and written stay in cache while a tile is copied. False for widths
// ByWidth has no copy of.
bool Transpose(const std::uint8_t* in, std::uint8_t* out, std::size_t width,
               std::int64_t rows, std::int64_t run, std::int64_t in_step,
               std::int64_t out_row) {
  constexpr std::int64_t kTile = 16;
  return ByWidth(width, [&](auto w) {
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const std::int64_t r1 = std::min(rows, r0 + kTile);
      for (std::int64_t c0 = 0; c0 < run; c0 += kTile) {
        const std::int64_t c1 = std::min(run, c0 + kTile);
        for (std::int64_t c = c0; c < c1; ++c) {
          const std::uint8_t* from = in + (c * in_step + r0) * w;
          std::uint8_t* to = out + (r0 * out_row + c) * w;
          for (std::int64_t r = r0; r < r1; ++r, from += w, to += out_row * w)
            std::memcpy(to, from, w);
        }
      }
    }
  });
}

}  // namespace

View Coalesced(const View& v) {
  View c;
  for (std::size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 1) continue;
    if (!c.sizes.empty() && c.in_strides.back() == v.in_strides[d] * v.sizes[d] &&
        c.out_strides.back() == v.out_strides[d] * v.sizes[d]) {
      c.sizes.back() *= v.sizes[d];
      c.in_strides.back() = v.in_strides[d];
      c.out_strides.back() = v.out_strides[d];
      continue;
    }
    c.sizes.push_back(v.sizes[d]);
    c.in_strides.push_back(v.in_strides[d]);
    c.out_strides.push_back(v.out_strides[d]);
  }
  if (c.sizes.empty()) c = {{1}, {1}, {1}};  // one element
  return c;
}

void CopyView(const std::uint8_t* in, std::uint8_t* out, std::size_t width,
              const View& view) {
  const View v = Coalesced(view);
  const auto w = static_cast<std::int64_t>(width);
  const int rank = static_cast<int>(v.sizes.size());
  // The last dimension is a run; the one before it, if any, its rows; the
  // others are walked with an index whose offsets are kept as it moves.
  const std::int64_t run = v.sizes[rank - 1];
  const std::int64_t in_step = v.in_strides[rank - 1], out_step = v.out_strides[rank - 1];
  const bool packed = in_step == 1 && out_step == 1;
  const std::int64_t rows = rank >= 2 ? v.sizes[rank - 2] : 1;
  const std::int64_t in_row = rank >= 2 ? v.in_strides[rank - 2] * w : 0;
  const std::int64_t out_row = rank >= 2 ? v.out_strides[rank - 2] * w : 0;
  const int outer = rank - 2;
  std::int64_t blocks = 1;
  for (int d = 0; d < outer; ++d) blocks *= v.sizes[d];
  std::vector<std::int64_t> index(static_cast<std::size_t>(std::max(outer, 0)), 0);
  std::int64_t src = 0, dst = 0;  // byte offsets of the block's first element
  // The last two dimensions swapped (the input steps by one down the
  // rows), over more than L1 holds: in tiles. A smaller block stays in L1
  // whichever way it is read, and row by row has less work.
  const bool transposed = !packed && out_step == 1 && rank >= 2 &&
                          v.in_strides[rank - 2] == 1 && rows * run * w > 32 * 1024;
  for (std::int64_t n = 0; n < blocks; ++n) {
    if (!transposed ||
        !Transpose(in + src, out + dst, width, rows, run, in_step, out_row / w)) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::uint8_t* from = in + src + r * in_row;
        std::uint8_t* to = out + dst + r * out_row;
        if (packed) {
          CopyBlock(from, to, static_cast<std::size_t>(run * w));
        } else {
          CopyRun(from, to, width, run, in_step, out_step);
        }
      }
    }
    for (int d = outer - 1; d >= 0; --d) {
      src += v.in_strides[d] * w;
      dst += v.out_strides[d] * w;
      if (++index[d] < v.sizes[d]) break;
      src -= v.in_strides[d] * w * v.sizes[d];
      dst -= v.out_strides[d] * w * v.sizes[d];
      index[d] = 0;
    }
  }
}

}  // namespace neuron::runtime::detail
