// The executor's strided_copy kernel: the elements of a strided view of one
// buffer into another (contiguous, or at strides of its own), raw bytes of
// any element width. The view's bounds are the caller's to check.
//
//   View v{{64, 32, 4, 32}, {384, 12288, 96, 1}, {4096, 128, 32, 1}};
//   CopyView(in + in_offset * 4, out + out_offset * 4, 4, v);   // a permute
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace neuron::runtime::detail {

// Sizes and element strides of each dimension, on both sides.
struct View {
  std::vector<std::int64_t> sizes, in_strides, out_strides;
};

// The same copy with fewer dimensions: sizes of 1 dropped, and neighbours
// that step as one on both sides merged (a contiguous view becomes one
// dimension of stride 1).
View Coalesced(const View& v);

// Copies every element of `v` (sizes > 0, strides >= 0) from `in` to
// `out`, each `width` bytes; runs contiguous on both sides as block copies.
void CopyView(const std::uint8_t* in, std::uint8_t* out, std::size_t width,
              const View& v);

}  // namespace neuron::runtime::detail
