// Lowering end to end: a graph becomes an executable that the runtime's
// executor runs, giving the reference's numbers, with a memory plan close
// to the lower bound; unsupported graphs are refused naming the node.
#include "neuron/compiler/lower.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "neuron/compiler/device_dtypes.h"
#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/native_ops.h"
#include "neuron/runtime/device/op_support.h"
#include "neuron/compiler/passes.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

using runtime::DeviceSpec;
using runtime::HostTensor;

proto::Value V(const std::string& name, std::vector<std::int64_t> shape,
               const std::string& dtype = "f32") {
  proto::Value v;
  v.set_name(name);
  v.mutable_type()->set_dtype(dtype);
  for (auto d : shape) v.mutable_type()->add_shape(d);
  return v;
}

// Elementwise within torch.testing.assert_close's float32 tolerances
// (rtol 1.3e-6, atol 1e-5): the executor's matmul is OpenBLAS's sgemm,
// whose summation order (blocking, fused multiply-add) is not the
// reference loops'.
void ExpectAllClose(const std::vector<float>& actual, const std::vector<float>& expected,
                    const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 + 1.3e-6 * std::fabs(expected[i]))
        << what << "[" << i << "]";
  }
}

std::vector<float> Values(int n, float scale, float shift) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * i + shift);
  return v;
}

void Constant(proto::Graph& g, const std::string& name, std::vector<std::int64_t> shape,
              const std::vector<float>& data) {
  auto* c = g.add_constants();
  *c->mutable_value() = V(name, shape);
  c->set_data(std::string(reinterpret_cast<const char*>(data.data()), data.size() * 4));
}

proto::Node* Node(proto::Graph& g, const std::string& op, std::vector<std::string> in,
                  proto::Value out) {
  auto* n = g.add_nodes();
  n->set_op(op);
  for (auto& i : in) n->add_inputs(i);
  *n->add_outputs() = std::move(out);
  return n;
}

constexpr int B = 4, D = 8, H = 16, O = 4;

// x[B,D] -> mm w1[D,H] -> + b1 -> gelu(tanh) -> mm w2[H,O] -> relu
proto::Graph Mlp() {
  proto::Graph g;
  g.set_name("mlp");
  *g.add_inputs() = V("x", {B, D});
  Constant(g, "w1", {D, H}, Values(D * H, 0.3f, 0.1f));
  Constant(g, "b1", {H}, Values(H, 0.2f, 0.5f));
  Constant(g, "w2", {H, O}, Values(H * O, 0.3f, 0.9f));
  Node(g, "aten.mm", {"x", "w1"}, V("0", {B, H}));
  Node(g, "aten.add", {"0", "b1"}, V("1", {B, H}));
  (*Node(g, "aten.gelu", {"1"}, V("2", {B, H}))->mutable_attrs())["approximate"].set_s(
      "tanh");
  Node(g, "aten.mm", {"2", "w2"}, V("3", {B, O}));
  Node(g, "aten.relu", {"3"}, V("4", {B, O}));
  g.add_outputs("4");
  return g;
}

std::vector<float> MatMul(const std::vector<float>& a, const std::vector<float>& b, int m,
                          int k, int n) {
  std::vector<float> c(m * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

TEST(DeviceDtypes, IrNamesAndElementTypesMapBothWays) {
  namespace rp = runtime::proto;
  for (const char* ir : {"f32", "bf16", "f16", "i64", "i32", "i8", "u8", "bool"}) {
    EXPECT_STREQ(IrDtypeName(DeviceElementType(ir, "test")), ir);
  }
  EXPECT_EQ(DeviceElementType("bf16", "test"), rp::BF16);
  try {
    DeviceElementType("f64", "graph g: input x");
    ADD_FAILURE() << "f64 was accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("graph g: input x: dtype f64 is not supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(NativeOps, EveryRowHasALoweringAndANameOfItsOwn) {
  std::set<std::string> names;
  for (const NativeOp& op : NativeOps()) {
    EXPECT_NE(op.lower, nullptr) << op.name;
    EXPECT_TRUE(names.insert(op.name).second) << op.name << " twice";
    EXPECT_EQ(FindNativeOp(op.name), &op);
    EXPECT_TRUE(
        std::set<std::string>({"tensor", "vector", "scalar", "gpsimd"}).count(op.engine))
        << op.name << ": " << op.engine;
  }
  EXPECT_EQ(FindNativeOp("aten.softplus"), nullptr);
}

// The compiler's rows are the runtime's native (or host-only) ops, so eager
// and compiled graphs agree on what runs on the device; what the compiler
// refuses carries the runtime table's reason.
TEST(NativeOps, AgreeWithTheRuntimesSupportTable) {
  for (const NativeOp& op : NativeOps()) {
    const runtime::OpSupport& row = runtime::SupportOf(SupportKey(op.name));
    EXPECT_TRUE(row.support == runtime::Support::kNative ||
                row.support == runtime::Support::kHostOnly)
        << op.name << " (" << SupportKey(op.name) << ") is " << runtime::Name(row.support)
        << " in runtime/src/device/op_support.cc";
  }
  EXPECT_EQ(SupportKey("aten.bernoulli_.float"), "bernoulli");
  EXPECT_EQ(SupportKey("aten.sum.dim_IntList"), "sum");
  EXPECT_EQ(SupportKey("aten._softmax"), "_softmax");
  EXPECT_EQ(NotNativeReason("aten.sort.stable").rfind("a CPU fallback: a sort", 0), 0u);
  EXPECT_EQ(NotNativeReason("aten.quantize_per_tensor").rfind("unsupported: quantized", 0), 0u);
}

TEST(Lower, AnMlpRunsOnTheExecutorAndMatchesTheReference) {
  const DeviceSpec device = DeviceSpec::Default();
  const Lowered lowered = Lower(Mlp(), device, "key-123");
  runtime::ValidateExecutable(lowered.executable, device);
  EXPECT_EQ(lowered.executable.graph_id(), "key-123");
  EXPECT_EQ(lowered.executable.device(), "neuroncore-v3");
  const std::vector<float> x = Values(B * D, 1.0f, 0.0f);
  runtime::Executor exec(device);
  const auto result =
      exec.Run(lowered.executable,
               {{"x", HostTensor::FromFloats(runtime::proto::F32, {B, D}, x)}});
  // The reference: plain float32 loops.
  auto h = MatMul(x, Values(D * H, 0.3f, 0.1f), B, D, H);
  const auto b1 = Values(H, 0.2f, 0.5f);
  for (int i = 0; i < B * H; ++i) {
    const float z = h[i] + b1[i % H];
    h[i] = 0.5f * z * (1 + std::tanh(0.7978845608028654f * (z + 0.044715f * z * z * z)));
  }
  auto y = MatMul(h, Values(H * O, 0.3f, 0.9f), B, H, O);
  for (auto& v : y) v = v > 0 ? v : 0.0f;
  ExpectAllClose(result.outputs.at("4").ToFloats(), y, "mlp output");
  EXPECT_EQ(result.outputs.at("4").shape, (std::vector<std::int64_t>{B, O}));
  // Two matmuls on the tensor engine; loads, the stores on DMA.
  // Each matmul: N < 64, so the minimum issue interval, x4 for float32.
  EXPECT_EQ(result.timing.tensor_cycles, 2u * 64u * 4u);
  EXPECT_GT(result.timing.total.count(), 0);
  // Memory: reuse brings the plan to the lower bound, below no reuse.
  EXPECT_GE(lowered.sbuf.planned_bytes, lowered.sbuf.lower_bound_bytes);
  EXPECT_LE(lowered.sbuf.planned_bytes, lowered.sbuf.lower_bound_bytes * 11 / 10);
  EXPECT_LT(lowered.sbuf.planned_bytes, lowered.sbuf.no_reuse_bytes);
}

TEST(Lower, UnsupportedGraphsAreRefusedNamingTheNode) {
  const DeviceSpec device = DeviceSpec::Default();
  auto message = [&](const proto::Graph& g) -> std::string {
    try {
      Lower(g, device);
    } catch (const InvalidUsage& e) {
      return e.what();
    }
    return "no error";
  };
  proto::Graph softmax = Mlp();
  softmax.mutable_nodes(4)->set_op("aten.cumprod");
  softmax.mutable_nodes(4)->set_source("model.py:42");
  EXPECT_NE(
      message(softmax).find("graph mlp: node 4 (aten.cumprod) from model.py:42: is not "
                            "supported on the device"),
      std::string::npos);
  proto::Graph f64 = Mlp();
  f64.mutable_inputs(0)->mutable_type()->set_dtype("f64");
  EXPECT_NE(message(f64).find("dtype f64 is not supported on the device"),
            std::string::npos);
  proto::Graph alpha = Mlp();
  (*alpha.mutable_nodes(1)->mutable_attrs())["alpha"].set_i(2);
  EXPECT_NE(message(alpha).find("node 1 (aten.add): alpha 2 is not supported"),
            std::string::npos);
  // Too big for SBUF (28 MiB): a 4096 x 4096 float32 activation.
  proto::Graph big;
  big.set_name("big");
  *big.add_inputs() = V("x", {4096, 4096});
  Node(big, "aten.relu", {"x"}, V("0", {4096, 4096}));
  big.add_outputs("0");
  EXPECT_NE(message(big).find("does not fit in SBUF"), std::string::npos);
}

TEST(MemoryPlan, GreedyBySizeReusesDeadValues) {
  // a lives 0-1, b 1-2, c 2-3, d 3-4: at most two alive at once.
  const MemoryPlan plan = PlanMemory(
      {{"a", 1000, 0, 1}, {"b", 1000, 1, 2}, {"c", 1000, 2, 3}, {"d", 1000, 3, 4}},
      1 << 20, 64);
  EXPECT_EQ(plan.lower_bound_bytes, 2u * 1024);
  EXPECT_EQ(plan.planned_bytes, 2u * 1024);
  EXPECT_EQ(plan.no_reuse_bytes, 4u * 1024);
  EXPECT_EQ(plan.offsets.at("a"), plan.offsets.at("c"));
  EXPECT_NE(plan.offsets.at("a"), plan.offsets.at("b"));
  EXPECT_THROW(PlanMemory({{"huge", 2 << 20, 0, 0}}, 1 << 20, 64), InvalidUsage);
}

// Attention's data movement and batched matmul: permute, unbind, stack,
// transpose, bmm, a scalar division, a broadcast mask and a sum over two
// dims, against loops over the same indices.
TEST(Lower, AttentionStyleViewsRunAgainstLoops) {
  const proto::Graph g = ParseGraph(
      R"(graph att(%x: f32[2,3,4], %mask: bool[3,3]) {
    %p: f32[4,2,3] = aten.permute(%x) {dims = [2, 0, 1]}
    %u_0: f32[2,3], %u_1: f32[2,3], %u_2: f32[2,3], %u_3: f32[2,3] = aten.unbind.int(%p) {dim = 0}
    %s: f32[2,2,3] = aten.stack(%u_1, %u_3) {dim = 0}
    %k: f32[2,3,2] = aten.transpose.int(%s) {dim0 = 1, dim1 = 2}
    %b: f32[2,2,2] = aten.bmm(%s, %k)
    %d: f32[2,2,2] = aten.div(%b) {other = 2.0}
    %x_t: f32[2,4,3] = aten.transpose.int(%x) {dim0 = 1, dim1 = 2}
    %xx: f32[2,3,3] = aten.bmm(%x, %x_t)
    %m: f32[2,3,3] = aten.masked_fill.Scalar(%xx, %mask) {value = -5.0}
    %r: f32[3] = aten.sum.dim_IntList(%m) {dim = [0, 1], keepdim = 0}
    return %d, %m, %r
  })");
  const DeviceSpec device = DeviceSpec::Default();
  const auto x = Values(24, 1, 0);
  HostTensor mask;
  mask.dtype = runtime::proto::BOOL;
  mask.shape = {3, 3};
  mask.data = {0, 1, 1, 0, 0, 1, 0, 0, 0};  // causal: above the diagonal
  const auto r = runtime::Executor(device).Run(
      Lower(g, device).executable,
      {{"x", HostTensor::FromFloats(runtime::proto::F32, {2, 3, 4}, x)}, {"mask", mask}});
  auto X = [&](int a, int b, int c) { return x[a * 12 + b * 4 + c]; };
  // s[i][a][b] = p[1 + 2i][a][b] = x[a][b][1 + 2i]; d = s s^T / 2 per i.
  std::vector<float> d(8), m(18), sum(3, 0.0f);
  for (int i = 0; i < 2; ++i)
    for (int a = 0; a < 2; ++a)
      for (int c = 0; c < 2; ++c) {
        float acc = 0;
        for (int b = 0; b < 3; ++b) acc += X(a, b, 1 + 2 * i) * X(c, b, 1 + 2 * i);
        d[i * 4 + a * 2 + c] = acc * 0.5f;
      }
  for (int a = 0; a < 2; ++a)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        float acc = 0;
        for (int c = 0; c < 4; ++c) acc += X(a, i, c) * X(a, j, c);
        m[a * 9 + i * 3 + j] = j > i ? -5.0f : acc;
      }
  for (int a = 0; a < 2; ++a)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) sum[j] += m[a * 9 + i * 3 + j];
  const auto got_d = r.outputs.at("d").ToFloats(), got_m = r.outputs.at("m").ToFloats(),
             got_r = r.outputs.at("r").ToFloats();
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got_d[i], d[i], 1e-5) << i;
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(got_m[i], m[i], 1e-5) << i;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got_r[i], sum[i], 1e-4) << i;
}

// Views that are a contiguous run of their input (unbind along the first
// dim, an expand to the same shape, a select or slice of whole rows, also
// of such a view) are its bytes, as on the device: only the permute and
// the slice across rows copy, and every value is the reference's.
TEST(Lower, ContiguousViewsAreTheirInputsBytes) {
  const proto::Graph g = ParseGraph(
      R"(graph runs(%x: f32[3,2,4]) {
    %p: f32[2,3,4] = aten.permute(%x) {dims = [1, 0, 2]}
    %u_0: f32[3,4], %u_1: f32[3,4] = aten.unbind.int(%p) {dim = 0}
    %e: f32[3,4] = aten.expand(%u_1) {size = [3, 4]}
    %s: f32[4] = aten.select.int(%u_1) {dim = 0, index = 2}
    %rows: f32[2,4] = aten.slice(%u_0) {dim = 0, start = 1, end = 3}
    %cols: f32[3,2] = aten.slice(%u_0) {dim = 1, start = 1, end = 3}
    %y: f32[3,4] = aten.add(%e, %u_0)
    %z: f32[4] = aten.mul(%s) {other = 2.0}
    return %y, %z, %rows, %cols, %u_1
  })");
  const DeviceSpec device = DeviceSpec::Default();
  const Lowered lowered = Lower(g, device);
  int copies = 0;
  for (const auto& i : lowered.executable.instructions())
    if (i.op() == runtime::proto::OP_STRIDED_COPY) ++copies;
  EXPECT_EQ(copies, 2);  // the permute and %cols
  const auto x = Values(24, 1, 0);
  const auto r = runtime::Executor(device).Run(
      lowered.executable,
      {{"x", HostTensor::FromFloats(runtime::proto::F32, {3, 2, 4}, x)}});
  auto U = [&](int k, int i, int j) {
    return x[i * 8 + k * 4 + j];
  };  // u_k[i][j] = x[i][k][j]
  std::vector<float> y, z, rows, cols, u1;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      y.push_back(U(1, i, j) + U(0, i, j));
      u1.push_back(U(1, i, j));
      if (i >= 1) rows.push_back(U(0, i, j));
      if (j >= 1 && j < 3) cols.push_back(U(0, i, j));
    }
  }
  for (int j = 0; j < 4; ++j) z.push_back(2 * U(1, 2, j));
  EXPECT_EQ(r.outputs.at("y").ToFloats(), y);
  EXPECT_EQ(r.outputs.at("z").ToFloats(), z);
  EXPECT_EQ(r.outputs.at("rows").ToFloats(), rows);
  EXPECT_EQ(r.outputs.at("cols").ToFloats(), cols);
  EXPECT_EQ(r.outputs.at("u_1").ToFloats(), u1);
}

// A scale, a masked_fill (its mask repeating over the batch) and an exp
// become one fused instruction, with the unfused reference's numbers; a
// mask that is not BOOL or U8 is refused naming the buffer.
TEST(Lower, AMaskedFillFusesWithItsNeighbours) {
  const proto::Graph g = ParseGraph(
      R"(graph masked(%x: f32[2,3,3], %mask: bool[3,3]) {
    %d: f32[2,3,3] = aten.div(%x) {other = 2.0}
    %m: f32[2,3,3] = aten.masked_fill.Scalar(%d, %mask) {value = -5.0}
    %e: f32[2,3,3] = aten.exp(%m)
    return %e
  })");
  const DeviceSpec device = DeviceSpec::Default();
  const Lowered lowered = Lower(g, device);
  int fused = 0, fused_ops = 0, alone = 0;
  for (const auto& i : lowered.executable.instructions()) {
    if (i.op() == runtime::proto::OP_FUSED) ++fused, fused_ops += i.fused_size();
    if (i.op() == runtime::proto::OP_MASKED_FILL) ++alone;
  }
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(fused_ops, 3);
  EXPECT_EQ(alone, 0);
  const auto x = Values(18, 1, 0);
  HostTensor mask;
  mask.dtype = runtime::proto::BOOL, mask.shape = {3, 3};
  mask.data = {0, 1, 1, 0, 0, 1, 0, 0, 0};
  const auto r = runtime::Executor(device).Run(
      lowered.executable,
      {{"x", HostTensor::FromFloats(runtime::proto::F32, {2, 3, 3}, x)}, {"mask", mask}});
  std::vector<float> e(18);
  for (int k = 0; k < 18; ++k) e[k] = std::exp(mask.data[k % 9] ? -5.0f : x[k] / 2.0f);
  ExpectAllClose(r.outputs.at("e").ToFloats(), e, "masked");
  // The same plan with a float32 mask.
  runtime::proto::Executable bad = lowered.executable;
  std::string mask_name;
  for (auto& b : *bad.mutable_buffers()) {
    if (b.dtype() == runtime::proto::BOOL) {
      b.set_dtype(runtime::proto::F32), b.set_bytes(36), mask_name = b.name();
    }
  }
  HostTensor float_mask =
      HostTensor::FromFloats(runtime::proto::F32, {3, 3}, std::vector<float>(9, 1.0f));
  std::string error = "no error";
  try {
    runtime::Executor(device).Run(
        bad, {{"x", HostTensor::FromFloats(runtime::proto::F32, {2, 3, 3}, x)},
              {"mask", float_mask}});
  } catch (const InvalidUsage& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("buffer " + mask_name + " is F32, not a BOOL or U8 mask"),
            std::string::npos)
      << error;
}

// A matmul's epilogue (bias, activation, a residual and a scale) and a view
// in between: the view costs nothing (the same bytes), the chain becomes one
// fused instruction whose intermediates never take SBUF, with the numbers
// of the unfused reference.
TEST(Lower, EpiloguesFuseAndViewsAreFree) {
  const proto::Graph g = ParseGraph(
      R"(graph epi(%x: f32[4,8], %w: f32[8,16], %b: f32[16], %r: f32[4,16]) {
    %mm: f32[4,16] = aten.addmm(%b, %x, %w)
    %v: f32[64] = aten.view(%mm) {size = [64]}
    %a: f32[64] = aten.tanh(%v)
    %back: f32[4,16] = aten.view(%a) {size = [4, 16]}
    %s: f32[4,16] = aten.add(%back, %r)
    %y: f32[4,16] = aten.mul(%s) {other = 0.5}
    return %y
  })");
  const DeviceSpec device = DeviceSpec::Default();
  const Lowered lowered = Lower(g, device);
  int fused = 0, fused_ops = 0, copies = 0;
  for (const auto& i : lowered.executable.instructions()) {
    if (i.op() == runtime::proto::OP_FUSED) ++fused, fused_ops += i.fused_size();
    if (i.op() == runtime::proto::OP_STRIDED_COPY) ++copies;
  }
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(fused_ops, 4);  // bias add from PSUM, tanh, residual add, scale
  EXPECT_EQ(copies, 0);
  const auto x = Values(32, 1, 0), w = Values(128, 0.3f, 0.5f), b = Values(16, 0.2f, 0.1f),
             r = Values(64, 0.7f, 0.9f);
  using runtime::proto::F32;
  const auto out = runtime::Executor(device).Run(
      lowered.executable, {{"x", HostTensor::FromFloats(F32, {4, 8}, x)},
                           {"w", HostTensor::FromFloats(F32, {8, 16}, w)},
                           {"b", HostTensor::FromFloats(F32, {16}, b)},
                           {"r", HostTensor::FromFloats(F32, {4, 16}, r)}});
  auto y = MatMul(x, w, 4, 8, 16);
  for (int i = 0; i < 64; ++i) y[i] = (std::tanh(y[i] + b[i % 16]) + r[i]) * 0.5f;
  ExpectAllClose(out.outputs.at("y").ToFloats(), y, "epilogue");
}

// Values that do not fit SBUF together go to HBM and come back (spill and
// reload DMAs, counted as such), with the same numbers.
TEST(Lower, ValuesThatDoNotFitSbufSpillToHbm) {
  runtime::proto::DeviceSpec spec = DeviceSpec::Default().spec();
  spec.mutable_sbuf()->set_bytes_per_partition(64);  // 8 KiB: four [16,32] f32 values
  spec.mutable_psum()->set_bytes_per_partition(64);
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  const DeviceSpec device = DeviceSpec::FromText(text, "small-sbuf");
  // At %p, five values would be alive (x, a, b, d, p); a and b wait for the end.
  const proto::Graph g = ParseGraph(
      R"(graph spill(%x: f32[16,32]) {
    %a: f32[16,32] = aten.relu(%x)
    %b: f32[16,32] = aten.neg(%x)
    %c: f32[16,32] = aten.tanh(%x)
    %d: f32[16,32] = aten.exp(%x)
    %p: f32[16,32] = aten.mul(%c, %d)
    %q: f32[16,32] = aten.add(%p, %p)
    %r: f32[16,32] = aten.mul(%q, %q)
    %s: f32[16,32] = aten.add(%a, %b)
    %t: f32[16,32] = aten.mul(%a, %b)
    %u: f32[16,32] = aten.add(%s, %t)
    %y: f32[16,32] = aten.add(%r, %u)
    return %y
  })");
  const Lowered lowered = Lower(g, device);
  int spills = 0;
  for (const auto& i : lowered.executable.instructions()) spills += i.spill() ? 1 : 0;
  EXPECT_GT(spills, 0);
  EXPECT_LE(lowered.sbuf.planned_bytes, device.SbufBytes());
  const auto x = Values(512, 2, 0.3f);
  const auto r = runtime::Executor(device).Run(
      lowered.executable, {{"x", HostTensor::FromFloats(runtime::proto::F32, {16, 32}, x)}});
  EXPECT_GT(r.timing.spill_bytes, 0u);
  std::vector<float> y(512);
  for (int i = 0; i < 512; ++i) {
    const float p = std::tanh(x[i]) * std::exp(x[i]), q = p + p;
    const float a = std::max(x[i], 0.0f), b = -x[i];
    y[i] = q * q + ((a + b) + a * b);
  }
  // exp is the executor's own, within an ulp or two of libm's.
  const std::vector<float> got = r.outputs.at("y").ToFloats();
  ASSERT_EQ(got.size(), y.size());
  for (int i = 0; i < 512; ++i) EXPECT_NEAR(got[i], y[i], 1e-6f * std::fabs(y[i])) << i;
}

// Gathering rows past the table is an error naming the index, not a read
// out of bounds.
TEST(Lower, EmbeddingIndicesOutsideTheTableAreRefused) {
  const proto::Graph g = ParseGraph(
      R"(graph emb(%w: f32[4,2], %i: i64[3]) {
    %e: f32[3,2] = aten.embedding(%w, %i)
    return %e
  })");
  const DeviceSpec device = DeviceSpec::Default();
  HostTensor index;
  index.dtype = runtime::proto::I64;
  index.shape = {3};
  const std::int64_t ids[3] = {1, 3, 4};
  index.data.resize(sizeof(ids));
  std::memcpy(index.data.data(), ids, sizeof(ids));
  try {
    runtime::Executor(device).Run(
        Lower(g, device).executable,
        {{"w", HostTensor::FromFloats(runtime::proto::F32, {4, 2}, Values(8, 1, 0))},
         {"i", index}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 4 (position 2) is outside the 4 rows"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace neuron::compiler

namespace neuron::compiler {
namespace {

// The forward graph AOTAutograd captures for Linear-ReLU-Linear (t, addmm,
// relu; an input returned as is) lowers and runs like the reference: its
// data movement bitwise, its arithmetic within the fp32 tolerances.
TEST(Lower, AnAotStyleForwardGraphRuns) {
  const proto::Graph g = ParseGraph(
      R"(graph fw(%p1: f32[16,8], %p2: f32[16], %p3: f32[4,16], %p4: f32[4], %p5: f32[4,8]) {
    %t: f32[8,16] = aten.t(%p1)
    %addmm: f32[4,16] = aten.addmm(%p2, %p5, %t)
    %relu: f32[4,16] = aten.relu(%addmm)
    %t_1: f32[16,4] = aten.t(%p3)
    %addmm_1: f32[4,4] = aten.addmm(%p4, %relu, %t_1)
    %s: f32[16] = aten.sum.dim_IntList(%relu) {dim = [0], keepdim = 0}
    return %addmm_1, %p5, %t_1, %relu, %s
  })");
  const DeviceSpec device = DeviceSpec::Default();
  const auto w1 = Values(16 * 8, 0.3f, 0.1f), b1 = Values(16, 0.2f, 0.3f),
             w2 = Values(4 * 16, 0.3f, 0.7f), b2 = Values(4, 0.2f, 0.9f),
             x = Values(4 * 8, 1, 0);
  using runtime::proto::F32;
  const auto r = runtime::Executor(device).Run(
      Lower(g, device).executable, {{"p1", HostTensor::FromFloats(F32, {16, 8}, w1)},
                                    {"p2", HostTensor::FromFloats(F32, {16}, b1)},
                                    {"p3", HostTensor::FromFloats(F32, {4, 16}, w2)},
                                    {"p4", HostTensor::FromFloats(F32, {4}, b2)},
                                    {"p5", HostTensor::FromFloats(F32, {4, 8}, x)}});
  auto transpose = [](const std::vector<float>& a, int rows, int cols) {
    std::vector<float> t(a.size());
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
    return t;
  };
  auto h = MatMul(x, transpose(w1, 16, 8), 4, 8, 16);
  for (int i = 0; i < 4 * 16; ++i) h[i] = std::max(h[i] + b1[i % 16], 0.0f);
  auto y = MatMul(h, transpose(w2, 4, 16), 4, 16, 4);
  for (int i = 0; i < 16; ++i) y[i] += b2[i % 4];
  std::vector<float> s(16, 0.0f);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 16; ++j) s[j] += h[i * 16 + j];
  ExpectAllClose(r.outputs.at("addmm_1").ToFloats(), y, "addmm_1");
  EXPECT_EQ(r.outputs.at("p5").ToFloats(), x);
  EXPECT_EQ(r.outputs.at("t_1").ToFloats(), transpose(w2, 4, 16));
  ExpectAllClose(r.outputs.at("relu").ToFloats(), h, "relu");
  ExpectAllClose(r.outputs.at("s").ToFloats(), s, "s");
}

std::vector<float> Transposed(const std::vector<float>& a, int rows, int cols) {
  std::vector<float> t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// Matmuls read transposed operands in place (FoldTransposesIntoMatmuls):
// no strided copy for t(w) or a bmm's transpose, the reference's numbers.
// A result over a quarter of PSUM runs in row tiles that read lhs rows and
// write result rows in place (parts of one SBUF value): no copies either,
// except the columns of a transposed lhs.
TEST(Lower, MatmulsReadTransposedOperandsAndTilesInPlace) {
  proto::Graph g = ParseGraph(
      R"(graph mm(%x: f32[4096,8], %w: f32[64,8], %b: f32[64], %xt: f32[8,4096], %q: f32[3,4,5], %k: f32[3,4,5]) {
    %wt: f32[8,64] = aten.t(%w)
    %big: f32[4096,64] = aten.addmm(%b, %x, %wt)
    %x_t: f32[4096,8] = aten.t(%xt)
    %cols: f32[4096,64] = aten.mm(%x_t, %wt)
    %kt: f32[3,5,4] = aten.transpose.int(%k) {dim0 = 1, dim1 = 2}
    %s: f32[3,4,4] = aten.bmm(%q, %kt)
    return %big, %cols, %s
  })");
  EXPECT_EQ(FoldTransposesIntoMatmuls(g), 4);
  EXPECT_EQ(EliminateDeadCode(g), 3);
  const DeviceSpec device = DeviceSpec::Default();
  ASSERT_GT(4096LL * 64 * 4, static_cast<long long>(device.PsumBytes() / 4));  // tiled
  const Lowered lowered = Lower(g, device);
  int copies = 0, matmuls = 0, transposed = 0;
  for (const auto& i : lowered.executable.instructions()) {
    if (i.op() == runtime::proto::OP_STRIDED_COPY) ++copies;
    if (i.op() == runtime::proto::OP_MATMUL) {
      ++matmuls;
      transposed += (i.transpose_lhs() ? 1 : 0) + (i.transpose_rhs() ? 1 : 0);
    }
  }
  const int tiles = (matmuls - 1) / 2;  // each big product's, and the bmm
  EXPECT_GT(tiles, 1);
  EXPECT_EQ(copies, tiles);  // only %cols's lhs columns, a slice per tile
  EXPECT_EQ(transposed, tiles + 2 * tiles + 1);
  const auto x = Values(4096 * 8, 1, 0), w = Values(64 * 8, 0.3f, 0.5f),
             b = Values(64, 0.2f, 0.1f), q = Values(60, 0.5f, 0.2f),
             k = Values(60, 0.4f, 0.8f);
  using runtime::proto::F32;
  const auto out = runtime::Executor(device).Run(
      lowered.executable,
      {{"x", HostTensor::FromFloats(F32, {4096, 8}, x)},
       {"w", HostTensor::FromFloats(F32, {64, 8}, w)},
       {"b", HostTensor::FromFloats(F32, {64}, b)},
       {"xt", HostTensor::FromFloats(F32, {8, 4096}, Transposed(x, 4096, 8))},
       {"q", HostTensor::FromFloats(F32, {3, 4, 5}, q)},
       {"k", HostTensor::FromFloats(F32, {3, 4, 5}, k)}});
  const auto cols = MatMul(x, Transposed(w, 64, 8), 4096, 8, 64);
  auto big = cols;
  for (std::size_t i = 0; i < big.size(); ++i) big[i] += b[i % 64];
  std::vector<float> s;
  for (int p = 0; p < 3; ++p) {
    const std::vector<float> qp(q.begin() + p * 20, q.begin() + (p + 1) * 20),
        kp(k.begin() + p * 20, k.begin() + (p + 1) * 20);
    const auto sp = MatMul(qp, Transposed(kp, 4, 5), 4, 5, 4);
    s.insert(s.end(), sp.begin(), sp.end());
  }
  ExpectAllClose(out.outputs.at("big").ToFloats(), big, "big");
  ExpectAllClose(out.outputs.at("cols").ToFloats(), cols, "cols");
  ExpectAllClose(out.outputs.at("s").ToFloats(), s, "s");
}

// Fusion and spilling see a part's reads as reads of its whole: a tiled
// matmul's lhs that one elementwise op also reads is not fused away into
// that op, and an lhs spilled before the matmul comes back whole before a
// tile reads its rows.
// A device whose PSUM makes tiles of 2 KiB (a quarter of it) and whose
// SBUF holds `sbuf_kib`.
DeviceSpec SmallDevice(int sbuf_kib) {
  runtime::proto::DeviceSpec spec = DeviceSpec::Default().spec();
  spec.mutable_sbuf()->set_bytes_per_partition(sbuf_kib * 8);
  spec.mutable_psum()->set_bytes_per_partition(64);
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return DeviceSpec::FromText(text, "small-sbuf");
}

template <typename Pred>
int CountOf(const Lowered& l, Pred pred) {
  int n = 0;
  for (const auto& i : l.executable.instructions()) n += pred(i) ? 1 : 0;
  return n;
}

TEST(Lower, TileReadsCountForFusionAndSpilling) {
  const auto x = Values(128 * 12, 1, 0.2f), w = Values(96, 0.4f, 0.7f),
             y = Values(1024, 0.5f, 0.1f);
  std::vector<float> a(x.size()), e(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) a[i] = std::max(x[i], 0.0f), e[i] = -a[i];
  using runtime::proto::F32;
  const std::map<std::string, HostTensor> inputs = {
      {"x", HostTensor::FromFloats(F32, {128, 12}, x)},
      {"w", HostTensor::FromFloats(F32, {12, 8}, w)},
      {"y", HostTensor::FromFloats(F32, {32, 32}, y)}};
  auto small = SmallDevice;
  auto count = [](const Lowered& l, auto&& pred) { return CountOf(l, pred); };
  auto is_matmul = [](const runtime::proto::Instruction& i) {
    return i.op() == runtime::proto::OP_MATMUL;
  };

  // %e, read after the tiles, fuses with nothing: %a stays where they read it.
  const Lowered fused = Lower(ParseGraph(R"(graph fuse(%x: f32[128,12], %w: f32[12,8]) {
    %a: f32[128,12] = aten.relu(%x)
    %m: f32[128,8] = aten.mm(%a, %w)
    %e: f32[128,12] = aten.neg(%a)
    return %m, %e
  })"),
                              small(20));
  EXPECT_EQ(count(fused, is_matmul), 2);
  auto r = runtime::Executor(small(20)).Run(
      fused.executable, {{"x", inputs.at("x")}, {"w", inputs.at("w")}});
  ExpectAllClose(r.outputs.at("m").ToFloats(), MatMul(a, w, 128, 12, 8), "m");
  EXPECT_EQ(r.outputs.at("e").ToFloats(), e);

  // At %q, %y, %p, %q (4 KiB each) and %a (6 KiB, read only by the tiles)
  // are alive: 18 KiB; %a goes to HBM and comes back for the matmul.
  const Lowered spilled =
      Lower(ParseGraph(R"(graph spill(%x: f32[128,12], %w: f32[12,8], %y: f32[32,32]) {
    %a: f32[128,12] = aten.relu(%x)
    %p: f32[32,32] = aten.tanh(%y)
    %q: f32[32,32] = aten.exp(%y)
    %t: f32[32,32] = aten.mul(%p, %q)
    %u: f32[32,32] = aten.add(%t, %t)
    %m: f32[128,8] = aten.mm(%a, %w)
    return %m
  })"),
            small(14));
  EXPECT_EQ(count(spilled, is_matmul), 2);
  EXPECT_GT(count(spilled,
                  [](const runtime::proto::Instruction& i) {
                    return i.spill() && i.source() == "reload %a";
                  }),
            0);
  r = runtime::Executor(small(14)).Run(spilled.executable, inputs);
  ExpectAllClose(r.outputs.at("m").ToFloats(), MatMul(a, w, 128, 12, 8), "m");
}

// A view's part of a value read by a fused chain (twice) after the value
// went to HBM: the chain reads the same rows of the reloaded copy.
TEST(Lower, AViewReadByAFusedChainIsReloadedWithItsValue) {
  const auto x = Values(128 * 12, 1, 0.2f), y = Values(1024, 0.5f, 0.1f);
  const Lowered view =
      Lower(ParseGraph(R"(graph spill_view(%x: f32[128,12], %y: f32[32,32]) {
    %a: f32[128,12] = aten.relu(%x)
    %s: f32[64,12] = aten.slice(%a) {dim = 0, start = 32, end = 96}
    %p: f32[32,32] = aten.tanh(%y)
    %q: f32[32,32] = aten.exp(%y)
    %t: f32[32,32] = aten.mul(%p, %q)
    %u: f32[32,32] = aten.add(%t, %t)
    %n: f32[64,12] = aten.neg(%s)
    %o: f32[64,12] = aten.mul(%n, %s)
    return %u, %o
  })"),
            SmallDevice(14));
  EXPECT_GT(CountOf(view,
                    [](const runtime::proto::Instruction& i) {
                      return i.source() == "reload %a";
                    }),
            0);
  const auto r =
      runtime::Executor(SmallDevice(14))
          .Run(view.executable,
               {{"x", HostTensor::FromFloats(runtime::proto::F32, {128, 12}, x)},
                {"y", HostTensor::FromFloats(runtime::proto::F32, {32, 32}, y)}});
  std::vector<float> o;
  for (int i = 32 * 12; i < 96 * 12; ++i) {
    const float relu = std::max(x[i], 0.0f);
    o.push_back(-relu * relu);
  }
  EXPECT_EQ(r.outputs.at("o").ToFloats(), o);
}

// A value whose only part nothing reads, and whose one reader could take
// its producer into a fused chain: it stays, and the part with it.
TEST(Lower, AValueWithAnUnreadPartIsNotFusedAway) {
  const DeviceSpec device = DeviceSpec::Default();
  const Lowered lowered = Lower(ParseGraph(R"(graph unread_part(%x: f32[4,8]) {
    %a: f32[4,8] = aten.add(%x, %x)
    %s: f32[8] = aten.select.int(%a) {dim = 0, index = 1}
    %z: f32[8] = aten.zeros_like(%s)
    %b: f32[4,8] = aten.neg(%a)
    return %b, %z
  })"),
                                device);
  const auto x = Values(32, 1, 0);
  const auto r = runtime::Executor(device).Run(
      lowered.executable,
      {{"x", HostTensor::FromFloats(runtime::proto::F32, {4, 8}, x)}});
  std::vector<float> b;
  for (float v : x) b.push_back(-(v + v));
  EXPECT_EQ(r.outputs.at("b").ToFloats(), b);
  EXPECT_EQ(r.outputs.at("z").ToFloats(), std::vector<float>(8, 0.0f));
}

// An elementwise epilogue of a tiled matmul (gelu of addmm's result, and
// gelu's backward reading a loaded input by rows, fused with a scale
// repeating along them) runs as one piece per tile, each reading its
// tile's rows in place; a product of two tiled results, whose pieces
// would all wait for the second's last tile, stays one step.
TEST(Lower, EpiloguesOfATiledMatmulRunTileByTile) {
  const DeviceSpec device = SmallDevice(64);  // tiles of 64 rows of 8
  const Lowered lowered = Lower(
      ParseGraph(
          R"(graph epilogue(%x: f32[256,12], %w: f32[12,8], %b: f32[8], %y: f32[256,8], %s: f32[8], %v: f32[12,8]) {
    %h: f32[256,8] = aten.addmm(%b, %x, %w)
    %g: f32[256,8] = aten.gelu(%h)
    %m: f32[256,8] = aten.mm(%x, %w)
    %d: f32[256,8] = aten.gelu_backward(%m, %y)
    %e: f32[256,8] = aten.mul(%d, %s)
    %z: f32[256,8] = aten.mm(%x, %v)
    %f: f32[256,8] = aten.mul(%m, %z)
    return %h, %g, %e, %f
  })"),
      device);
  const auto& e = lowered.executable;
  std::map<std::uint32_t, std::string> names;
  for (const auto& b : e.buffers()) names[b.id()] = b.name();
  int gelu = 0, backward = 0, products = 0, whole_products = 0;
  for (const auto& i : e.instructions()) {
    const bool is_gelu = i.op() == runtime::proto::OP_GELU_EXACT;
    const bool is_backward = i.op() == runtime::proto::OP_FUSED;
    products += i.op() == runtime::proto::OP_MUL && i.elements() == 64 * 8 ? 1 : 0;
    whole_products += i.op() == runtime::proto::OP_MUL && i.elements() == 256 * 8 ? 1 : 0;
    if (!is_gelu && !is_backward) continue;
    (is_gelu ? gelu : backward) += 1;
    EXPECT_EQ(i.elements(), 64 * 8);
    const std::string tile = is_gelu ? "h.tile" : "m.tile";
    EXPECT_TRUE(
        std::any_of(i.inputs().begin(), i.inputs().end(),
                    [&](std::uint32_t b) { return names[b].rfind(tile, 0) == 0; }))
        << "a piece reads its tile of " << tile;
  }
  EXPECT_EQ(gelu, 4);
  EXPECT_EQ(backward, 4);  // gelu_backward and mul, fused
  EXPECT_EQ(products, 0);
  EXPECT_EQ(whole_products, 1);

  const auto x = Values(256 * 12, 1, 0.2f), w = Values(96, 0.4f, 0.7f),
             b = Values(8, 0.3f, 0.1f), y = Values(256 * 8, 1.5f, 0.4f),
             scale = Values(8, 2, 0.9f), v = Values(96, 0.5f, 0.3f);
  using runtime::proto::F32;
  const auto r =
      runtime::Executor(device).Run(e, {{"x", HostTensor::FromFloats(F32, {256, 12}, x)},
                                        {"w", HostTensor::FromFloats(F32, {12, 8}, w)},
                                        {"b", HostTensor::FromFloats(F32, {8}, b)},
                                        {"y", HostTensor::FromFloats(F32, {256, 8}, y)},
                                        {"s", HostTensor::FromFloats(F32, {8}, scale)},
                                        {"v", HostTensor::FromFloats(F32, {12, 8}, v)}});
  const auto m = MatMul(x, w, 256, 12, 8), z = MatMul(x, v, 256, 12, 8);
  std::vector<float> h(m.size()), g(m.size()), grad(m.size()), f(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    h[i] = m[i] + b[i % 8];
    g[i] = static_cast<float>(0.5 * h[i] * (1 + std::erf(h[i] / std::sqrt(2.0))));
    const double cdf = 0.5 * (1 + std::erf(y[i] / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * y[i] * y[i]) / std::sqrt(2 * M_PI);
    grad[i] = static_cast<float>(m[i] * (cdf + y[i] * pdf) * scale[i % 8]);
    f[i] = m[i] * z[i];
  }
  ExpectAllClose(r.outputs.at("h").ToFloats(), h, "h");
  ExpectAllClose(r.outputs.at("g").ToFloats(), g, "g");
  ExpectAllClose(r.outputs.at("e").ToFloats(), grad, "e");
  ExpectAllClose(r.outputs.at("f").ToFloats(), f, "f");
}

// A tiled epilogue's result is written in parts, which spilling never
// moves: when SBUF cannot hold the plan with it, the epilogue stays one
// step and its result goes to HBM instead.
TEST(Lower, AnEpilogueSbufCannotHoldInPiecesStaysWhole) {
  const DeviceSpec device = SmallDevice(14);
  const Lowered lowered =
      Lower(ParseGraph(R"(graph whole(%x: f32[128,12], %w: f32[12,8], %y: f32[32,32]) {
    %m: f32[128,8] = aten.mm(%x, %w)
    %g: f32[128,8] = aten.gelu(%m)
    %p: f32[32,32] = aten.tanh(%y)
    %q: f32[32,32] = aten.exp(%y)
    %t: f32[32,32] = aten.mul(%p, %q)
    %u: f32[32,32] = aten.add(%t, %t)
    return %u, %g
  })"),
            device);
  int gelu = 0, spills = 0;
  for (const auto& i : lowered.executable.instructions()) {
    gelu += i.op() == runtime::proto::OP_GELU_EXACT ? 1 : 0;
    spills += i.spill() ? 1 : 0;
  }
  EXPECT_EQ(gelu, 1);
  EXPECT_GT(spills, 0);
}

// Attention's backward layout: a transpose stacked with two values, the
// stack permuted. The stack and the transpose are never made: each input
// is copied once, straight into the permuted result.
constexpr const char* kStackedGraph =
    R"(graph stacked(%a: f32[4,2,6], %b: f32[4,6,2], %c: f32[4,2,6]) {
    %bt: f32[4,2,6] = aten.transpose.int(%b) {dim0 = 1, dim1 = 2}
    %s: f32[3,4,2,6] = aten.stack(%a, %bt, %c) {dim = 0}
    %p: f32[2,4,3,6] = aten.permute(%s) {dims = [2, 1, 0, 3]}
    return %p%RETURNED
  })";

// The stack s[k][j][i][l] of a, b's transpose and c (a and c [batches,
// rows, cols], b [batches, cols, rows]) and its permute p[i][j][k][l] =
// s[k][j][i][l].
struct Stacked {
  std::vector<float> s, p;
};
Stacked StackedReference(const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<float>& c, int batches, int rows, int cols) {
  Stacked want{std::vector<float>(a.size() * 3), std::vector<float>(a.size() * 3)};
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < batches; ++j)
      for (int k = 0; k < 3; ++k)
        for (int l = 0; l < cols; ++l) {
          const auto at = static_cast<std::size_t>((j * rows + i) * cols + l);
          const float v = k == 0 ? a[at]
                          : k == 1
                              ? b[static_cast<std::size_t>((j * cols + l) * rows + i)]
                              : c[at];
          want.p[static_cast<std::size_t>(((i * batches + j) * 3 + k) * cols + l)] = v;
          want.s[static_cast<std::size_t>(((k * batches + j) * rows + i) * cols + l)] = v;
        }
  return want;
}

void RunStacked(const Lowered& lowered, bool also_s) {
  using runtime::proto::F32;
  const auto a = Values(48, 1, 0.1f), b = Values(48, 1, 0.5f), c = Values(48, 1, 0.9f);
  const auto r =
      runtime::Executor(DeviceSpec::Default())
          .Run(lowered.executable, {{"a", HostTensor::FromFloats(F32, {4, 2, 6}, a)},
                                    {"b", HostTensor::FromFloats(F32, {4, 6, 2}, b)},
                                    {"c", HostTensor::FromFloats(F32, {4, 2, 6}, c)}});
  const Stacked want = StackedReference(a, b, c, 4, 2, 6);
  EXPECT_EQ(r.outputs.at("p").ToFloats(), want.p);
  if (also_s) {
    EXPECT_EQ(r.outputs.at("s").ToFloats(), want.s);
  }
}

TEST(Lower, AStackPermutedIsWrittenInItsPermutedPlaces) {
  std::string text = kStackedGraph;
  text.replace(text.find("%RETURNED"), 9, "");
  const Lowered lowered = Lower(ParseGraph(text), DeviceSpec::Default());
  std::set<std::string> names;
  for (const auto& b : lowered.executable.buffers()) names.insert(b.name());
  EXPECT_EQ(names.count("s"), 0u);
  EXPECT_EQ(names.count("bt"), 0u);
  const int copies = CountOf(lowered, [](const runtime::proto::Instruction& i) {
    return i.op() == runtime::proto::OP_STRIDED_COPY;
  });
  EXPECT_EQ(copies, 3);  // a, b and c, each into p
  RunStacked(lowered, false);
}

// A stack that is also returned is made: its permute stays a copy of it.
TEST(Lower, AStackReadTwiceStays) {
  std::string text = kStackedGraph;
  text.replace(text.find("%RETURNED"), 9, ", %s");
  const Lowered lowered = Lower(ParseGraph(text), DeviceSpec::Default());
  const int copies = CountOf(lowered, [](const runtime::proto::Instruction& i) {
    return i.op() == runtime::proto::OP_STRIDED_COPY;
  });
  EXPECT_EQ(copies, 4);  // b's transpose composed into the stack; a, c; the permute
  RunStacked(lowered, true);
}

// A composed value is written by several copies and never spilled from
// its first writer on: here b's transpose is composed into p before two
// matmuls whose operands need the room. Where SBUF is that tight (36-47
// KiB) Lower lowers the graph again without composing: the stack is made
// (spilled at 36) and permuted, 5 copies; from 48 KiB the stack and the
// transpose are never made, 3 copies. Either way p is the reference's.
TEST(Lower, AGraphThatFitsOnlyUncomposedIsLoweredWithoutComposing) {
  const std::string text =
      R"(graph retry(%a: f32[4,32,8], %b: f32[4,8,32], %x: f32[32,32], %w1: f32[32,128], %w2: f32[128,32]) {
    %bt: f32[4,32,8] = aten.transpose.int(%b) {dim0 = 1, dim1 = 2}
    %h: f32[32,128] = aten.mm(%x, %w1)
    %g: f32[32,128] = aten.gelu(%h)
    %o: f32[32,32] = aten.mm(%g, %w2)
    %c: f32[4,32,8] = aten.view(%o) {size = [4, 32, 8]}
    %s: f32[3,4,32,8] = aten.stack(%a, %bt, %c) {dim = 0}
    %p: f32[32,4,3,8] = aten.permute(%s) {dims = [2, 1, 0, 3]}
    return %p
  })";
  const auto a = Values(1024, 1, 0.1f), b = Values(1024, 1, 0.5f),
             x = Values(1024, 0.5f, 0.2f), w1 = Values(4096, 0.2f, 0.3f),
             w2 = Values(4096, 0.1f, 0.7f);
  std::vector<float> g = MatMul(x, w1, 32, 32, 128);
  for (float& v : g) v = static_cast<float>(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
  const std::vector<float> c = MatMul(g, w2, 32, 128, 32);
  const std::vector<float> want = StackedReference(a, b, c, 4, 32, 8).p;
  using runtime::proto::F32;
  const std::map<std::string, HostTensor> inputs = {
      {"a", HostTensor::FromFloats(F32, {4, 32, 8}, a)},
      {"b", HostTensor::FromFloats(F32, {4, 8, 32}, b)},
      {"x", HostTensor::FromFloats(F32, {32, 32}, x)},
      {"w1", HostTensor::FromFloats(F32, {32, 128}, w1)},
      {"w2", HostTensor::FromFloats(F32, {128, 32}, w2)}};
  for (const int kib : {36, 40, 47, 48}) {
    SCOPED_TRACE(StrCat(kib, " KiB of SBUF"));
    const DeviceSpec device = SmallDevice(kib);
    const Lowered lowered = Lower(ParseGraph(text), device);
    const bool composed = kib >= 48;
    std::set<std::string> names;
    for (const auto& buffer : lowered.executable.buffers()) names.insert(buffer.name());
    EXPECT_EQ(names.count("s"), composed ? 0u : 1u);
    EXPECT_EQ(CountOf(lowered,
                      [](const runtime::proto::Instruction& i) {
                        return i.op() == runtime::proto::OP_STRIDED_COPY;
                      }),
              composed ? 3 : 5);
    EXPECT_EQ(CountOf(lowered,
                      [](const runtime::proto::Instruction& i) { return i.spill(); }) > 0,
              kib == 36);
    const auto r = runtime::Executor(device).Run(lowered.executable, inputs);
    ExpectAllClose(r.outputs.at("p").ToFloats(), want, "p");
  }
}

// Lower keeps whichever plan the model times faster: the same two layers
// with their epilogues in pieces at 40 KiB of SBUF, whole at 32 KiB, where
// the pieces' parts (which spilling never moves) and their inputs loaded
// early make the tiled plan spill five times as long.
TEST(Lower, TheModelChoosesBetweenTiledAndWholeEpilogues) {
  const std::string text =
      R"(graph layers(%x: f32[128,16], %b: f32[16], %w0: f32[16,16], %y0: f32[128,16], %w1: f32[16,16], %y1: f32[128,16]) {
    %h0: f32[128,16] = aten.addmm(%b, %x, %w0)
    %g0: f32[128,16] = aten.gelu(%h0)
    %e0: f32[128,16] = aten.mul(%g0, %y0)
    %h1: f32[128,16] = aten.addmm(%b, %e0, %w1)
    %g1: f32[128,16] = aten.gelu(%h1)
    %e1: f32[128,16] = aten.mul(%g1, %y1)
    return %e1
  })";
  const auto x = Values(128 * 16, 1, 0.2f), b = Values(16, 0.3f, 0.1f),
             w0 = Values(256, 0.3f, 0.2f), w1 = Values(256, 0.2f, 0.4f),
             y0 = Values(128 * 16, 1.5f, 0.4f), y1 = Values(128 * 16, 0.7f, 0.9f);
  auto layer = [&](const std::vector<float>& in, const std::vector<float>& w,
                   const std::vector<float>& y) {
    std::vector<float> out = MatMul(in, w, 128, 16, 16);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double h = out[i] + b[i % 16];
      out[i] = static_cast<float>(0.5 * h * (1 + std::erf(h / std::sqrt(2.0))) * y[i]);
    }
    return out;
  };
  const auto want = layer(layer(x, w0, y0), w1, y1);
  using runtime::proto::F32;
  const std::map<std::string, HostTensor> inputs = {
      {"x", HostTensor::FromFloats(F32, {128, 16}, x)},
      {"b", HostTensor::FromFloats(F32, {16}, b)},
      {"w0", HostTensor::FromFloats(F32, {16, 16}, w0)},
      {"y0", HostTensor::FromFloats(F32, {128, 16}, y0)},
      {"w1", HostTensor::FromFloats(F32, {16, 16}, w1)},
      {"y1", HostTensor::FromFloats(F32, {128, 16}, y1)}};
  double modelled_us[2] = {0, 0};
  for (const int kib : {40, 32}) {
    SCOPED_TRACE(StrCat(kib, " KiB of SBUF"));
    const DeviceSpec device = SmallDevice(kib);
    const Lowered lowered = Lower(ParseGraph(text), device);
    int whole = 0, pieces = 0;
    for (const auto& i : lowered.executable.instructions()) {
      if (i.op() != runtime::proto::OP_FUSED) continue;  // gelu and mul
      (i.elements() == 128 * 16 ? whole : pieces) += 1;
    }
    EXPECT_EQ(whole, kib == 40 ? 0 : 2);
    EXPECT_EQ(pieces == 0, kib == 32);
    modelled_us[kib == 40 ? 0 : 1] = lowered.schedule.after_us;
    const auto r = runtime::Executor(device).Run(lowered.executable, inputs);
    ExpectAllClose(r.outputs.at("e1").ToFloats(), want, "e1");
  }
  // At 40 KiB the pieces overlap the matmuls: faster than the whole plan
  // Lower keeps at 32 KiB.
  EXPECT_LT(modelled_us[0], modelled_us[1]);
}

// An epilogue that reads an input twice (a fused y * y) loads it once,
// before the first piece.
TEST(Lower, AnEpilogueReadingAnInputTwiceLoadsItOnce) {
  const DeviceSpec device = SmallDevice(64);
  const Lowered lowered =
      Lower(ParseGraph(R"(graph twice(%x: f32[256,12], %w: f32[12,8], %y: f32[256,8]) {
    %m: f32[256,8] = aten.mm(%x, %w)
    %t: f32[256,8] = aten.mul(%y, %y)
    %u: f32[256,8] = aten.mul(%m, %t)
    return %u
  })"),
            device);
  const int loads = CountOf(lowered, [](const runtime::proto::Instruction& i) {
    return i.op() == runtime::proto::OP_LOAD;
  });
  const int pieces = CountOf(lowered, [](const runtime::proto::Instruction& i) {
    return i.op() == runtime::proto::OP_FUSED && i.elements() == 64 * 8;
  });
  EXPECT_EQ(loads, 3);  // x, w, y
  EXPECT_EQ(pieces, 4);
  const auto x = Values(256 * 12, 1, 0.2f), w = Values(96, 0.4f, 0.7f),
             y = Values(256 * 8, 1.5f, 0.4f);
  using runtime::proto::F32;
  const auto r = runtime::Executor(device).Run(
      lowered.executable, {{"x", HostTensor::FromFloats(F32, {256, 12}, x)},
                           {"w", HostTensor::FromFloats(F32, {12, 8}, w)},
                           {"y", HostTensor::FromFloats(F32, {256, 8}, y)}});
  auto u = MatMul(x, w, 256, 12, 8);
  for (std::size_t i = 0; i < u.size(); ++i) u[i] *= y[i] * y[i];
  ExpectAllClose(r.outputs.at("u").ToFloats(), u, "u");
}

}  // namespace
}  // namespace neuron::compiler
