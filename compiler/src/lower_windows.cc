// Window ops: convolution (im2col on GpSimd, then matmuls on the tensor
// engine; col2im for the input's gradient) and max pooling on GpSimd.
#include <string>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {
namespace {

// A GpSimd window step (im2col, col2im, maxpool2d and its backward) with
// the geometry `g` (N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW).
void WindowStep(LoweringContext& cx, rp::Op op, const std::vector<std::string>& reads,
                const std::vector<std::string>& writes,
                const std::vector<std::int64_t>& g, const std::string& source) {
  rp::Instruction& i = cx.AddStep(rp::GPSIMD, op, reads, writes, source);
  for (auto v : g) i.add_view_sizes(v);
}

// A (height, width) attribute: one int for both, or two; `fallback` when
// absent.
std::vector<std::int64_t> Pair(const proto::Node& n, const char* key,
                               std::int64_t fallback) {
  std::vector<std::int64_t> v = AttrInts(n, key);
  if (v.empty()) v = {fallback};
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

// The window geometry over an [N, C, H, W] input, output size last:
// {N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW} (torch's formula, no
// ceil_mode).
std::vector<std::int64_t> Geometry(const std::vector<std::int64_t>& x, std::int64_t kh,
                                   std::int64_t kw,
                                   const std::vector<std::int64_t>& stride,
                                   const std::vector<std::int64_t>& pad,
                                   const std::vector<std::int64_t>& dil) {
  const std::int64_t oh = (x[2] + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
  const std::int64_t ow = (x[3] + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
  return {x[0],      x[1],   x[2],   x[3],   kh,     kw, stride[0],
          stride[1], pad[0], pad[1], dil[0], dil[1], oh, ow};
}

// max_pool2d_with_indices (x -> maxima, indices) and its backward (grad,
// x, indices -> grad x) on GpSimd.
void MaxPool(LoweringContext& cx, const OpCall& call,
             const std::vector<std::int64_t>& x) {
  const proto::Node& n = call.node;
  const auto kernel = Pair(n, "kernel_size", 1);
  auto stride = Pair(n, "stride", 0);
  if (stride[0] == 0) stride = kernel;  // torch: the kernel size by default
  NEURON_CHECK(AttrInt(n, "ceil_mode", 0) == 0, call.where,
               ": ceil_mode is not supported");
  const std::vector<std::int64_t> g = Geometry(
      x, kernel[0], kernel[1], stride, Pair(n, "padding", 0), Pair(n, "dilation", 1));
  if (n.op() == "aten.max_pool2d_with_indices") {
    NEURON_CHECK(n.outputs_size() == 2, call.where, ": gives the maxima and the indices");
    WindowStep(cx, rp::OP_MAXPOOL2D, {call.in[0]},
               {n.outputs(0).name(), n.outputs(1).name()}, g, call.source);
  } else {
    NEURON_CHECK(call.in.size() == 3, call.where,
                 ": takes the gradient, the input and the indices");
    WindowStep(cx, rp::OP_MAXPOOL2D_BACKWARD, {call.in[0], call.in[2]},
               {n.outputs(0).name()}, g, call.source);
  }
}

// A convolution's shapes: the window geometry `g`, M = N * OH * OW rows
// of K = C * KH * KW columns, OC output channels.
struct ConvShape {
  std::vector<std::int64_t> g;
  std::int64_t m, k, oc;
};

// convolution forward: rows [M, OC] = cols x weight^T (+ bias), then to
// [N, OC, OH, OW].
void ConvolutionForward(LoweringContext& cx, const OpCall& call, const ConvShape& s,
                        const std::string& cols) {
  const std::string base = call.node.outputs(0).name();
  // The weight [OC, C, KH, KW] as [OC, K], read transposed.
  const std::string wflat = base + ".wflat";
  cx.Alias(wflat, TempValue(wflat, cx.TypeOf(call.in[1]).dtype(), {s.oc, s.k}),
           call.in[1]);
  const std::string rows = base + ".rows";
  const proto::Value rows_value =
      TempValue(rows, call.node.outputs(0).type().dtype(), {s.m, s.oc});
  MatmulDims dims{s.m, s.k, s.oc};
  dims.transpose_rhs = true;
  cx.Matmul(cols, wflat, rows_value, dims, call.where, call.source,
            call.in.size() > 2 ? call.in[2] : std::string());
  const std::int64_t oh = s.g[12], ow = s.g[13];
  cx.StridedCopy(rows, base, {s.g[0], s.oc, oh, ow}, {oh * ow * s.oc, 1, ow * s.oc, s.oc},
                 0, call.source);
}

// convolution_backward (grad, x, weight -> grad x, grad weight, grad bias).
void ConvolutionBackward(LoweringContext& cx, const OpCall& call, const ConvShape& s,
                         const std::string& cols) {
  const proto::Node& n = call.node;
  const std::string& where = call.where;
  const std::string& source = call.source;
  const std::int64_t M = s.m, K = s.k, OC = s.oc, OH = s.g[12], OW = s.g[13];
  // Grad rows [M, OC] from the gradient [N, OC, OH, OW].
  const std::string base = n.outputs(0).name();
  const std::string grows = base + ".grows";
  const std::string gdtype = cx.TypeOf(call.in[0]).dtype();
  cx.AddSlot(grows, TempValue(grows, gdtype, {M, OC}), rp::SBUF, where);
  cx.StridedCopy(call.in[0], grows, {s.g[0], OH, OW, OC}, {OC * OH * OW, OW, 1, OH * OW},
                 0, source);
  // grad weight [OC, K] = grows^T x cols, grows read transposed.
  const std::string gw = base + ".gw";
  MatmulDims gw_dims{OC, M, K};
  gw_dims.transpose_lhs = true;
  cx.Matmul(grows, cols, TempValue(gw, n.outputs(1).type().dtype(), {OC, K}), gw_dims,
            where, source);
  cx.StridedCopy(gw, n.outputs(1).name(), {OC * K}, {1}, 0, source);
  // grad input: col2im(grows x weight [OC, K]).
  const std::string& weight = call.in[2];
  const std::string gcols = base + ".gcols", wflat = base + ".wflat";
  cx.Alias(wflat, TempValue(wflat, cx.TypeOf(weight).dtype(), {OC, K}), weight);
  cx.Matmul(grows, wflat, TempValue(gcols, n.outputs(0).type().dtype(), {M, K}),
            MatmulDims{M, OC, K}, where, source);
  WindowStep(cx, rp::OP_COL2IM, {gcols}, {base}, s.g, source);
  // grad bias [OC]: the gradient's rows summed.
  cx.Elementwise(rp::VECTOR, rp::OP_SUM_ROWS, {grows}, n.outputs(2).name(), source);
  cx.LastInstruction().set_m(M);
  cx.LastInstruction().set_n(OC);
}

}  // namespace

// convolution (x, weight[, bias]) and convolution_backward (grad, x,
// weight -> grad x, grad weight, grad bias): 2-D, groups 1, not
// transposed; as im2col on GpSimd and matmuls on the tensor engine (the
// bias added as the rows leave PSUM), col2im for the input's gradient.
// max_pool2d_with_indices and its backward on GpSimd.
void LowerWindows(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const bool conv = n.op() == "aten.convolution";
  const bool backward = n.op() == "aten.convolution_backward" ||
                        n.op() == "aten.max_pool2d_with_indices_backward";
  NEURON_CHECK(!call.in.empty(), call.where, ": takes tensor inputs");
  NEURON_CHECK(call.in.size() > (backward ? 1u : 0u), call.where,
               ": takes the gradient and the input");
  const auto x = Shape(cx.TypeOf(call.in[backward ? 1 : 0]));
  NEURON_CHECK(x.size() == 4, call.where, ": supported for [N, C, H, W] inputs");
  cx.AddOutputSlots(n, call.where);
  if (n.op().rfind("aten.max_pool2d", 0) == 0) return MaxPool(cx, call, x);
  NEURON_CHECK(AttrInt(n, "transposed", 0) == 0 && AttrInt(n, "groups", 1) == 1,
               call.where, ": supported for groups 1, not transposed");
  NEURON_CHECK(conv || (call.in.size() == 3 && n.outputs_size() == 3), call.where,
               ": takes (grad, input, weight), gives three gradients");
  NEURON_CHECK(call.in.size() >= 2, call.where, ": takes an input and a weight");
  const auto w = Shape(cx.TypeOf(call.in[conv ? 1 : 2]));
  NEURON_CHECK(w.size() == 4 && w[1] == x[1], call.where,
               ": a [OC, C, KH, KW] weight for C = ", x[1]);
  ConvShape s;
  s.g = Geometry(x, w[2], w[3], Pair(n, "stride", 1), Pair(n, "padding", 0),
                 Pair(n, "dilation", 1));
  s.m = x[0] * s.g[12] * s.g[13];
  s.k = x[1] * w[2] * w[3];
  s.oc = w[0];
  const std::string cols = n.outputs(0).name() + ".cols";
  cx.AddSlot(cols, TempValue(cols, cx.TypeOf(call.in[conv ? 0 : 1]).dtype(), {s.m, s.k}),
             rp::SBUF, call.where);
  WindowStep(cx, rp::OP_IM2COL, {call.in[conv ? 0 : 1]}, {cols}, s.g, call.source);
  if (conv) {
    ConvolutionForward(cx, call, s, cols);
  } else {
    ConvolutionBackward(cx, call, s, cols);
  }
}

}  // namespace neuron::compiler
