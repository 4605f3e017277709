// The executor's 2-D window ops on GpSimd, as lower_windows.cc lowers
// them (geometry in view_sizes: N, C, H, W, KH, KW, stride, padding,
// dilation, OH, OW): im2col (raw elements of any dtype, the same in and
// out), col2im (F32, BF16 or F16, summed in float32), maxpool2d (a float
// image -> float maxima and I64 indices) and maxpool2d_backward (float
// gradient and I64 indices -> float).
#include "exec_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {
namespace {

// The geometry of a 2-D window op (convolution's im2col, max pooling), from
// view_sizes: N, C, H, W, KH, KW, stride h/w, padding h/w, dilation h/w, OH, OW.
struct Window {
  std::int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  // The input row and column of output (y, x) at kernel offset (i, j); may
  // fall in the padding (outside 0..h-1, 0..w-1).
  std::int64_t Row(std::int64_t y, std::int64_t i) const { return y * sh - ph + i * dh; }
  std::int64_t Col(std::int64_t x, std::int64_t j) const { return x * sw - pw + j * dw; }
};

// Calls tap(row, col, at) for every kernel tap of every output position
// that falls inside the image: row of the columns matrix (n, oh, ow), its
// column (c, kh, kw), and the element of the image [N,C,H,W] it reads.
template <typename Tap>
void ForEachTap(const Window& g, Tap tap) {
  const std::int64_t cols = g.c * g.kh * g.kw;
  for (std::int64_t b = 0; b < g.n; ++b)
    for (std::int64_t y = 0; y < g.oh; ++y)
      for (std::int64_t x = 0; x < g.ow; ++x) {
        const std::int64_t row = (b * g.oh + y) * g.ow + x;
        for (std::int64_t ch = 0; ch < g.c; ++ch)
          for (std::int64_t p = 0; p < g.kh; ++p)
            for (std::int64_t q = 0; q < g.kw; ++q) {
              const std::int64_t r = g.Row(y, p), c = g.Col(x, q);
              if (r < 0 || r >= g.h || c < 0 || c >= g.w) continue;
              tap(row * cols + (ch * g.kh + p) * g.kw + q,
                  ((b * g.c + ch) * g.h + r) * g.w + c);
            }
      }
}

Window WindowOf(const proto::Instruction& i, const What& what) {
  NEURON_CHECK(i.view_sizes_size() == 14, what,
               ": a window op needs 14 geometry values, got ", i.view_sizes_size());
  const auto v = [&](int k) { return i.view_sizes(k); };
  Window g{v(0), v(1), v(2), v(3),  v(4),  v(5),  v(6),
           v(7), v(8), v(9), v(10), v(11), v(12), v(13)};
  NEURON_CHECK(g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0 && g.kh > 0 && g.kw > 0, what,
               ": non-positive kernel, stride or dilation");
  return g;
}

}  // namespace

// im2col: x [N,C,H,W] -> cols [N*OH*OW, C*KH*KW] (raw elements, 0 in the
// padding); col2im: the sum back into [N,C,H,W] (float32).
void RunIm2Col(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what) {
  NEURON_CHECK(in.size() == 1 && out.size() == 1, what, ": ", DeviceOpName(i.op()),
               " reads and writes one");
  const Window g = WindowOf(i, what);
  const std::int64_t rows = g.n * g.oh * g.ow, cols = g.c * g.kh * g.kw;
  const std::int64_t image = g.n * g.c * g.h * g.w;
  if (i.op() == proto::OP_IM2COL) {
    NEURON_CHECK(in[0].elements() >= static_cast<std::size_t>(image) &&
                     out[0].elements() >= static_cast<std::size_t>(rows * cols) &&
                     in[0].buffer->dtype() == out[0].buffer->dtype(),
                 what, ": buffers do not fit the window");
    const std::size_t width = ElementBytes(in[0].buffer->dtype());
    std::memset(out[0].data, 0, static_cast<std::size_t>(rows * cols) * width);
    ForEachTap(g, [&](std::int64_t column, std::int64_t pixel) {
      std::memcpy(out[0].data + column * width, in[0].data + pixel * width, width);
    });
    return;
  }
  NEURON_CHECK(in[0].elements() >= static_cast<std::size_t>(rows * cols) &&
                   out[0].elements() >= static_cast<std::size_t>(image) &&
                   kernels::IsFloat(in[0].buffer->dtype()) &&
                   kernels::IsFloat(out[0].buffer->dtype()),
               what, ": buffers do not fit the window");
  const auto colsv = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), rows * cols);
  std::vector<float> sum(static_cast<std::size_t>(image), 0.0f);
  ForEachTap(
      g, [&](std::int64_t column, std::int64_t pixel) { sum[pixel] += colsv[column]; });
  kernels::FromFloat(sum, out[0].buffer->dtype(), out[0].data);
}

// maxpool2d: x -> (the window maxima, their flat indices h * W + w, int64);
// maxpool2d_backward: (grad, indices) -> the gradient summed at the indices.
void RunMaxPool(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what) {
  const Window g = WindowOf(i, what);
  const std::int64_t planes = g.n * g.c, pooled = g.oh * g.ow, plane = g.h * g.w;
  if (i.op() == proto::OP_MAXPOOL2D) {
    NEURON_CHECK(in.size() == 1 && out.size() == 2 &&
                     kernels::IsFloat(in[0].buffer->dtype()) &&
                     out[1].buffer->dtype() == proto::I64 &&
                     in[0].elements() >= static_cast<std::size_t>(planes * plane) &&
                     out[0].elements() >= static_cast<std::size_t>(planes * pooled),
                 what, ": maxpool2d takes a float image, gives maxima and int64 indices");
    const auto x = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), planes * plane);
    std::vector<float> y(static_cast<std::size_t>(planes * pooled));
    auto* index = reinterpret_cast<std::int64_t*>(out[1].data);
    for (std::int64_t pl = 0; pl < planes; ++pl)
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          float best = -INFINITY;
          std::int64_t at = -1;
          for (std::int64_t p = 0; p < g.kh; ++p)
            for (std::int64_t q = 0; q < g.kw; ++q) {
              const std::int64_t r = g.Row(oy, p), c = g.Col(ox, q);
              if (r < 0 || r >= g.h || c < 0 || c >= g.w) continue;
              const float v = x[pl * plane + r * g.w + c];
              if (at < 0 || v > best || std::isnan(v)) best = v, at = r * g.w + c;
            }
          y[pl * pooled + oy * g.ow + ox] = best;
          index[pl * pooled + oy * g.ow + ox] = at;
        }
    kernels::FromFloat(y, out[0].buffer->dtype(), out[0].data);
    return;
  }
  NEURON_CHECK(in.size() == 2 && out.size() == 1 && in[1].buffer->dtype() == proto::I64 &&
                   in[0].elements() >= static_cast<std::size_t>(planes * pooled) &&
                   out[0].elements() >= static_cast<std::size_t>(planes * plane),
               what, ": maxpool2d_backward takes the gradient and int64 indices");
  const auto grad = kernels::ToFloat(in[0].data, in[0].buffer->dtype(), planes * pooled);
  const auto* index = reinterpret_cast<const std::int64_t*>(in[1].data);
  std::vector<float> gx(static_cast<std::size_t>(planes * plane), 0.0f);
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t k = 0; k < pooled; ++k) {
      const std::int64_t at = index[pl * pooled + k];
      NEURON_CHECK(at >= 0 && at < plane, what, ": index ", at, " outside a plane of ",
                   plane);
      gx[pl * plane + at] += grad[pl * pooled + k];
    }
  kernels::FromFloat(gx, out[0].buffer->dtype(), out[0].data);
}

}  // namespace neuron::runtime::detail
