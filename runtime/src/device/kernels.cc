#include "kernels.h"

#include <algorithm>
#include <cmath>

#include "neuron/runtime/device/sgemm.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/half.h"
#include "vector_math.h"

namespace neuron::runtime::kernels {

bool IsFloat(proto::ElementType type) {
  if (type == proto::ELEMENT_TYPE_UNSPECIFIED) return false;
#define NEURON_DEVICE_FLOAT(Id, bytes, floating, name, ir, Torch, Device) \
  if (type == proto::Device) return floating;
  NEURON_FORALL_DTYPES(NEURON_DEVICE_FLOAT)
#undef NEURON_DEVICE_FLOAT
  return false;
}

std::vector<float> ToFloat(const std::uint8_t* data, proto::ElementType type,
                           std::size_t n) {
  std::vector<float> out(n);
  if (type == proto::F32) {
    std::copy_n(reinterpret_cast<const float*>(data), n, out.data());
    return out;
  }
  const auto* h = reinterpret_cast<const std::uint16_t*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = type == proto::BF16 ? BFloat16ToFloat(h[i]) : HalfToFloat(h[i]);
  }
  return out;
}

void FromFloat(const float* values, std::size_t n, proto::ElementType type,
               std::uint8_t* out) {
  if (type == proto::F32) {
    std::copy_n(values, n, reinterpret_cast<float*>(out));
    return;
  }
  auto* h = reinterpret_cast<std::uint16_t*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    h[i] = type == proto::BF16 ? FloatToBFloat16(values[i]) : FloatToHalf(values[i]);
  }
}

void FromFloat(const std::vector<float>& values, proto::ElementType type,
               std::uint8_t* out) {
  FromFloat(values.data(), values.size(), type, out);
}

void Matmul(const float* a, const float* b, float* c, std::int64_t batch, std::int64_t m,
            std::int64_t k, std::int64_t n, bool accumulate, bool transpose_a,
            bool transpose_b) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + batch * m * n, 0.0f);
    return;
  }
  CurrentSgemm().run(a, b, c, batch, m, k, n, accumulate, transpose_a, transpose_b);
}

namespace {

float Gelu(float x) {                   // torch.nn.functional.gelu(approximate="tanh")
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

}  // namespace

NEURON_KERNEL_CLONES
bool Unary(proto::Op op, const float* a, std::size_t n, double scalar, float* out) {
  const float s = static_cast<float>(scalar);
  if (op == proto::OP_EXP) {
    lanes::Dispatch([&](auto width) NEURON_LANES_INLINE_LAMBDA {
      using V = typename decltype(width)::V;
      lanes::Map<V>(a, out, n,
                    [](V x) NEURON_LANES_INLINE_LAMBDA { return lanes::Exp(x); });
    });
    return true;
  }
  if (op == proto::OP_GELU_EXACT) {  // torch.nn.functional.gelu(approximate="none")
    lanes::Dispatch([&](auto width) NEURON_LANES_INLINE_LAMBDA {
      using V = typename decltype(width)::V;
      lanes::Map<V>(a, out, n, [](V x) NEURON_LANES_INLINE_LAMBDA {
        return 0.5f * x * (1.0f + lanes::Erf(x * 0.7071067811865476f));
      });
    });
    return true;
  }
  auto apply = [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = f(a[i]);
    return true;
  };
  if (op == proto::OP_COPY) return apply([](float x) { return x; });
  if (op == proto::OP_RELU) return apply([](float x) { return x > 0 ? x : 0.0f; });
  if (op == proto::OP_NEG) return apply([](float x) { return -x; });
  if (op == proto::OP_ABS) return apply([](float x) { return std::fabs(x); });
  if (op == proto::OP_SIGN)
    return apply([](float x) { return static_cast<float>((x > 0) - (x < 0)); });
  if (op == proto::OP_TANH) return apply([](float x) { return std::tanh(x); });
  // Correctly rounded, as torch's CPU kernels (sqrt, then 1 / it for rsqrt).
  if (op == proto::OP_SQRT) return apply([](float x) { return std::sqrt(x); });
  if (op == proto::OP_RSQRT) return apply([](float x) { return 1.0f / std::sqrt(x); });
  if (op == proto::OP_SIGMOID)
    return apply([](float x) { return 1.0f / (1.0f + std::exp(-x)); });
  if (op == proto::OP_GELU) return apply(Gelu);
  if (op == proto::OP_SCALE) return apply([s](float x) { return x * s; });
  if (op == proto::OP_ADD_SCALAR) return apply([s](float x) { return x + s; });
  // As torch.clamp: a NaN input stays NaN (the comparison is false); a NaN
  // bound makes every element NaN.
  if ((op == proto::OP_CLAMP_MIN || op == proto::OP_CLAMP_MAX) && std::isnan(s)) {
    return apply([s](float) { return s; });
  }
  if (op == proto::OP_CLAMP_MIN) return apply([s](float x) { return x < s ? s : x; });
  if (op == proto::OP_CLAMP_MAX) return apply([s](float x) { return x > s ? s : x; });
  return false;
}

NEURON_KERNEL_CLONES
bool Binary(proto::Op op, const float* a, const float* b, std::size_t nb, double scalar,
            float* out, std::size_t n) {
  if (nb == 0) return n == 0;
  if (op == proto::OP_GELU_EXACT_BACKWARD) {  // d/dx x * Phi(x) = Phi(x) + x * phi(x)
    lanes::Dispatch([&](auto width) NEURON_LANES_INLINE_LAMBDA {
      using V = typename decltype(width)::V;
      for (std::size_t base = 0; base < n; base += nb) {
        lanes::Map2<V>(a + base, b, out + base, std::min(nb, n - base),
                       [](V g, V x) NEURON_LANES_INLINE_LAMBDA {
                         return g * lanes::GeluExactDerivative(x);
                       });
      }
    });
    return true;
  }
  // b repeats every nb elements: blocks of nb, no index arithmetic per element.
  auto apply = [&](auto f) {
    const float* x = a;
    const float* y = b;
    float* z = out;
    if (nb == 1) {
      const float scalar_b = y[0];
      for (std::size_t i = 0; i < n; ++i) z[i] = f(x[i], scalar_b);
      return true;
    }
    for (std::size_t base = 0; base < n; base += nb) {
      const std::size_t len = std::min(nb, n - base);
      for (std::size_t j = 0; j < len; ++j) z[base + j] = f(x[base + j], y[j]);
    }
    return true;
  };
  if (op == proto::OP_ADD) return apply([](float x, float y) { return x + y; });
  if (op == proto::OP_SUB) return apply([](float x, float y) { return x - y; });
  if (op == proto::OP_MUL) return apply([](float x, float y) { return x * y; });
  if (op == proto::OP_DIV) return apply([](float x, float y) { return x / y; });
  if (op == proto::OP_TANH_BACKWARD)
    return apply([](float g, float y) { return g * (1 - y * y); });
  if (op == proto::OP_SIGMOID_BACKWARD)
    return apply([](float g, float y) { return g * y * (1 - y); });
  if (op == proto::OP_MAX) return apply([](float x, float y) { return std::max(x, y); });
  if (op == proto::OP_MIN) return apply([](float x, float y) { return std::min(x, y); });
  if (op == proto::OP_GELU_BACKWARD) {  // a: the gradient, b: the input; tanh form
    return apply([](float g, float x) {
      const float c = 0.7978845608028654f, k = 0.044715f;
      const float t = std::tanh(c * (x + k * x * x * x));
      return g * (0.5f * (1 + t) + 0.5f * x * (1 - t * t) * c * (1 + 3 * k * x * x));
    });
  }
  if (op == proto::OP_MASKED_FILL) {  // b: the mask, 1 where set
    const float fill = static_cast<float>(scalar);
    return apply([fill](float x, float m) { return m != 0 ? fill : x; });
  }
  if (op == proto::OP_THRESHOLD_BACKWARD) {  // a: the gradient, b: the forward input
    const float t = static_cast<float>(scalar);
    return apply([t](float g, float x) { return x > t ? g : 0.0f; });
  }
  return false;
}

namespace {

// Shaped's row ops in lanes of V.
template <typename V>
NEURON_LANES_INLINE bool RowOps(proto::Op op, const std::vector<const float*>& in,
                                std::int64_t rows, std::int64_t cols, float* out) {
  const float* a = in[0];
  const auto width = static_cast<std::size_t>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = a + r * cols;
    float* y = out + r * cols;
    if (op == proto::OP_SOFTMAX_ROWS || op == proto::OP_LOG_SOFTMAX_ROWS) {
      const float max = cols > 0 ? lanes::Max<V>(x, width) : 0.0f;
      lanes::Map<V>(x, y, width, [max](V v) NEURON_LANES_INLINE_LAMBDA {
        // <= 0; a row holding a NaN sums to NaN, whatever its max.
        return lanes::ExpOfNonPositive(v - max);
      });
      const float sum = lanes::Sum<V>(y, width);
      if (op == proto::OP_SOFTMAX_ROWS) {
        const float inverse = 1.0f / sum;
        for (std::int64_t c = 0; c < cols; ++c) y[c] *= inverse;
      } else {
        const float shift = max + std::log(sum);
        for (std::int64_t c = 0; c < cols; ++c) y[c] = x[c] - shift;
      }
    } else if (op == proto::OP_SOFTMAX_BACKWARD_ROWS) {  // y = out * (g - sum(g * out))
      const float* o = in[1] + r * cols;
      const float dot = lanes::SumOf2<V>(
          x, o, width, [](V g, V v) NEURON_LANES_INLINE_LAMBDA { return g * v; });
      for (std::int64_t c = 0; c < cols; ++c) y[c] = o[c] * (x[c] - dot);
    } else if (op == proto::OP_LOG_SOFTMAX_BACKWARD_ROWS) {  // y = g - exp(out) * sum(g)
      const float sum = lanes::Sum<V>(x, width);
      lanes::Map2<V>(x, in[1] + r * cols, y, width,
                     [sum](V g, V v)
                         NEURON_LANES_INLINE_LAMBDA { return g - lanes::Exp(v) * sum; });
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

NEURON_KERNEL_CLONES
bool Shaped(proto::Op op, const std::vector<const float*>& in, std::int64_t rows,
            std::int64_t cols, float* out) {
  const float* a = in[0];
  if (op == proto::OP_TRANSPOSE) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = a[r * cols + c];
    }
    return true;
  }
  if (op == proto::OP_SUM_ROWS) {
    std::fill(out, out + cols, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) out[c] += a[r * cols + c];
    }
    return true;
  }
  return lanes::Dispatch([&](auto lane_width) NEURON_LANES_INLINE_LAMBDA {
    return RowOps<typename decltype(lane_width)::V>(op, in, rows, cols, out);
  });
}

// The row loops below: reductions in lanes (a float sum in order would wait
// on each add), the elementwise parts left for the compiler to vectorize.
NEURON_KERNEL_CLONES
void LayerNorm(const float* x, const float* w, const float* b, std::int64_t rows,
               std::int64_t cols, double eps, float* y, float* mean, float* rstd) {
  const auto width = static_cast<std::size_t>(cols);
  const float count = static_cast<float>(cols);
  lanes::Dispatch([&](auto lane_width) NEURON_LANES_INLINE_LAMBDA {
    using V = typename decltype(lane_width)::V;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const float m = lanes::Sum<V>(xr, width) / count;
      const float var = lanes::SumOf2<V>(xr, xr, width,
                                         [m](V u, V) NEURON_LANES_INLINE_LAMBDA {
                                           return (u - m) * (u - m);
                                         }) /
                        count;
      const float inv = 1.0f / std::sqrt(var + static_cast<float>(eps));
      mean[r] = m;
      rstd[r] = inv;
      for (std::int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * inv * w[c] + b[c];
    }
  });
}

NEURON_KERNEL_CLONES
void LayerNormBackward(const float* g, const float* x, const float* mean,
                       const float* rstd, const float* w, std::int64_t rows,
                       std::int64_t cols, float* gx, float* gw, float* gb) {
  const auto width = static_cast<std::size_t>(cols);
  const float count = static_cast<float>(cols);
  std::fill(gw, gw + cols, 0.0f);
  std::fill(gb, gb + cols, 0.0f);
  std::vector<float> xhat_row(width), gxhat_row(width);
  lanes::Dispatch([&](auto lane_width) NEURON_LANES_INLINE_LAMBDA {
    using V = typename decltype(lane_width)::V;
    float* __restrict xhat = xhat_row.data();
    float* __restrict gxhat = gxhat_row.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* gr = g + r * cols;
      const float mu = mean[r], s = rstd[r];
      for (std::int64_t c = 0; c < cols; ++c) {
        xhat[c] = (xr[c] - mu) * s;
        gxhat[c] = gr[c] * w[c];
      }
      for (std::int64_t c = 0; c < cols; ++c) {
        gw[c] += gr[c] * xhat[c];
        gb[c] += gr[c];
      }
      const float mean_gxhat = lanes::Sum<V>(gxhat, width) / count;
      const float mean_gxhat_xhat =
          lanes::SumOf2<V>(gxhat, xhat, width,
                           [](V u, V v) NEURON_LANES_INLINE_LAMBDA { return u * v; }) /
          count;
      float* gxr = gx + r * cols;
      for (std::int64_t c = 0; c < cols; ++c)
        gxr[c] = s * (gxhat[c] - mean_gxhat - xhat[c] * mean_gxhat_xhat);
    }
  });
}

template <typename Acc>
void Cumsum(const float* a, std::int64_t outer, std::int64_t len, std::int64_t inner,
            float* out) {
  std::vector<Acc> sum(static_cast<std::size_t>(inner));
  for (std::int64_t o = 0; o < outer; ++o) {
    std::fill(sum.begin(), sum.end(), Acc(0));
    for (std::int64_t t = 0; t < len; ++t) {
      const std::int64_t base = (o * len + t) * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        sum[static_cast<std::size_t>(i)] += a[base + i];
        out[base + i] = static_cast<float>(sum[static_cast<std::size_t>(i)]);
      }
    }
  }
}

template void Cumsum<double>(const float*, std::int64_t, std::int64_t, std::int64_t,
                             float*);
template void Cumsum<float>(const float*, std::int64_t, std::int64_t, std::int64_t,
                            float*);

}  // namespace neuron::runtime::kernels
