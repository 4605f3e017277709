// The executor: a small plan (an MLP layer: load, matmul, bias, GELU,
// store) computes the reference's numbers, reports the modelled timeline,
// and holds device memory only while it runs; bad plans and inputs are
// refused naming the instruction or binding.
#include "neuron/runtime/device/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "error_of.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/half.h"

namespace neuron::runtime {
namespace {

constexpr int kM = 4, kK = 8, kN = 16;

proto::Buffer* Buffer(proto::Executable& e, std::uint32_t id, proto::MemorySpace space,
                      std::uint64_t offset, proto::ElementType dtype,
                      std::vector<std::int64_t> shape) {
  auto* b = e.add_buffers();
  b->set_id(id), b->set_name("b" + std::to_string(id)), b->set_space(space);
  b->set_offset(offset), b->set_dtype(dtype);
  std::int64_t n = 1;
  for (auto d : shape) b->add_shape(d), n *= d;
  b->set_bytes(n * ElementBytes(dtype));
  return b;
}

proto::Instruction* Op(proto::Executable& e, std::uint32_t id, proto::EngineKind engine,
                       proto::Op op, std::vector<std::uint32_t> in,
                       std::vector<std::uint32_t> out, std::vector<std::uint32_t> deps) {
  auto* i = e.add_instructions();
  i->set_id(id), i->set_engine(engine), i->set_op(op);
  for (auto b : in) i->add_inputs(b);
  for (auto b : out) i->add_outputs(b);
  for (auto d : deps) i->add_deps(d);
  return i;
}

std::vector<float> Weights() {
  std::vector<float> w(kK * kN);
  for (int i = 0; i < kK * kN; ++i)
    w[i] = BFloat16ToFloat(FloatToBFloat16(0.05f * (i % 13) - 0.3f));
  return w;
}

proto::Executable MlpLayer() {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("mlp/forward/0");
  Buffer(e, 0, proto::HBM, 0, proto::F32, {kM, kK});      // x
  Buffer(e, 1, proto::HBM, 4096, proto::BF16, {kK, kN});  // W (constant)
  Buffer(e, 2, proto::HBM, 8192, proto::F32, {kN});       // bias (constant)
  Buffer(e, 3, proto::SBUF, 0, proto::F32, {kM, kK});
  Buffer(e, 4, proto::SBUF, 4096, proto::BF16, {kK, kN});
  Buffer(e, 5, proto::SBUF, 8192, proto::F32, {kN});
  Buffer(e, 6, proto::PSUM, 0, proto::F32, {kM, kN});
  Buffer(e, 7, proto::SBUF, 12288, proto::BF16, {kM, kN});  // gelu output, bf16
  Buffer(e, 8, proto::HBM, 16384, proto::BF16, {kM, kN});   // y
  Op(e, 0, proto::DMA, proto::OP_LOAD, {0}, {3}, {})->set_bytes(kM * kK * 4);
  Op(e, 1, proto::DMA, proto::OP_LOAD, {1}, {4}, {})->set_bytes(kK * kN * 2);
  Op(e, 2, proto::DMA, proto::OP_LOAD, {2}, {5}, {})->set_bytes(kN * 4);
  for (int i = 0; i < 3; ++i) e.mutable_instructions(i)->set_partitions(kK);
  auto* mm = Op(e, 3, proto::TENSOR, proto::OP_MATMUL, {3, 4}, {6}, {0, 1});
  mm->set_m(kM), mm->set_k(kK), mm->set_n(kN);
  auto* bias = Op(e, 4, proto::VECTOR, proto::OP_ADD, {6, 5}, {6}, {3, 2});
  bias->set_elements(kM * kN), bias->set_operand_count(2);
  auto* act = Op(e, 5, proto::SCALAR, proto::OP_GELU, {6}, {7}, {4});
  act->set_elements(kM * kN), act->set_operand_count(1);
  auto* store = Op(e, 6, proto::DMA, proto::OP_STORE, {7}, {8}, {5});
  store->set_bytes(kM * kN * 2), store->set_partitions(kM);
  auto* w = e.add_constants();
  w->set_buffer(1);
  const HostTensor wt = HostTensor::FromFloats(proto::BF16, {kK, kN}, Weights());
  w->set_data(std::string(wt.data.begin(), wt.data.end()));
  std::vector<float> b(kN);
  for (int j = 0; j < kN; ++j) b[j] = 0.1f * j - 0.5f;
  auto* bc = e.add_constants();
  bc->set_buffer(2);
  bc->set_data(std::string(reinterpret_cast<const char*>(b.data()), kN * 4));
  auto* x = e.add_inputs();
  x->set_name("x"), x->set_buffer(0);
  auto* y = e.add_outputs();
  y->set_name("y"), y->set_buffer(8);
  return e;
}

std::vector<float> Input() {
  std::vector<float> x(kM * kK);
  for (int i = 0; i < kM * kK; ++i) x[i] = std::sin(0.7f * i);
  return x;
}

TEST(Executor, AnMlpLayerComputesTheReferenceAndItsModelledTime) {
  MemoryCounters memory;
  memory.SetPhase("step");
  Executor exec(DeviceSpec::Default(), &memory);
  const proto::Executable e = MlpLayer();
  ExecutionResult r =
      exec.Run(e, {{"x", HostTensor::FromFloats(proto::F32, {kM, kK}, Input())}});
  const HostTensor& y = r.outputs.at("y");
  EXPECT_EQ(y.dtype, proto::BF16);
  EXPECT_EQ(y.shape, (std::vector<std::int64_t>{kM, kN}));
  const std::vector<float> got = y.ToFloats(), x = Input(), w = Weights();
  for (int i = 0; i < kM; ++i) {
    for (int j = 0; j < kN; ++j) {
      float acc = 0;
      for (int p = 0; p < kK; ++p) acc += x[i * kK + p] * w[p * kN + j];
      const float z = acc + (0.1f * j - 0.5f);
      const float gelu =
          0.5f * z * (1 + std::tanh(0.7978845608028654f * (z + 0.044715f * z * z * z)));
      EXPECT_EQ(got[i * kN + j], BFloat16ToFloat(FloatToBFloat16(gelu))) << i << "," << j;
    }
  }
  EXPECT_EQ(r.timing.schedule.size(), 7u);
  EXPECT_GT(r.timing.total.count(), 0);
  EXPECT_DOUBLE_EQ(r.timing.flops, 2.0 * kM * kK * kN);
  // Memory is held only during the run.
  const MemorySnapshot s = memory.Snapshot();
  EXPECT_EQ(s.current.reserved, 0u);
  EXPECT_GT(s.phases.at("step").reserved, 0u);
  EXPECT_GE(s.phases.at("step").reserved, s.phases.at("step").allocated);
}

using testing::ErrorOf;

TEST(Executor, BadPlansAndInputsAreRefusedNamingWhere) {
  MemoryCounters memory;
  Executor exec(DeviceSpec::Default(), &memory);
  const auto x = HostTensor::FromFloats(proto::F32, {kM, kK}, Input());
  EXPECT_NE(ErrorOf([&] {
              exec.Run(MlpLayer(), {});
            }).find("executable 'mlp/forward/0': input 'x' was not given"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(MlpLayer(),
                       {{"x", HostTensor::FromFloats(proto::BF16, {kM, kK}, Input())}});
            }).find("input 'x' is 64 bytes of BF16; the plan expects 128 bytes of F32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(MlpLayer(), {{"x", x}, {"z", x}});
            }).find("2 inputs given, the plan takes 1"),
            std::string::npos);
  proto::Executable unknown = MlpLayer();
  unknown.mutable_instructions(5)->set_op(
      static_cast<proto::Op>(200));  // a newer format's
  EXPECT_NE(ErrorOf([&] {
              exec.Run(unknown, {{"x", x}});
            }).find("instruction 5 (op 200): unknown op 200"),
            std::string::npos);
  proto::Executable arity = MlpLayer();  // a binary op given one input
  arity.mutable_instructions(5)->set_op(proto::OP_SUB);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(arity, {{"x", x}});
            }).find("instruction 5 (sub): sub is not a unary op"),
            std::string::npos);
  proto::Executable engine = MlpLayer();  // a DMA op on the vector engine
  engine.mutable_instructions(4)->set_op(proto::OP_LOAD);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(engine, {{"x", x}});
            }).find("instruction 4 (load): not an op of engine VECTOR"),
            std::string::npos);
  proto::Executable shape = MlpLayer();
  shape.mutable_instructions(3)->set_k(kK + 1);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(shape, {{"x", x}});
            }).find("instruction 3 (matmul): buffers of"),
            std::string::npos);
  proto::Executable ints = MlpLayer();
  ints.mutable_buffers(3)->set_dtype(proto::I32);
  EXPECT_NE(ErrorOf([&] {
              exec.Run(ints, {{"x", x}});
            }).find("is I32; matmul takes F32, BF16 or F16"),
            std::string::npos);
  // Every failed run gave its memory back.
  EXPECT_EQ(memory.Snapshot().current.reserved, 0u);
}

}  // namespace
}  // namespace neuron::runtime

namespace neuron::runtime {
namespace {

// x (16 floats) -> SBUF; `half`: a copy writes only the first 8 of a
// buffer y then stores all 16; else y = x + y where y was never written.
// `twice`: out is bound to two names, so it is copied out of the plan's
// memory, where the other plan's runs leave bytes; else it has its own
// block, where y lives, and which may be memory an earlier result freed.
proto::Executable ReadsUnwritten(bool half, bool twice) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("unwritten");
  Buffer(e, 0, proto::HBM, 0, proto::F32, {16});    // x
  Buffer(e, 1, proto::SBUF, 0, proto::F32, {16});   // x, loaded
  Buffer(e, 2, proto::SBUF, 64, proto::F32, {16});  // y
  Buffer(e, 3, proto::HBM, 128, proto::F32, {16});  // out
  Op(e, 0, proto::DMA, proto::OP_LOAD, {0}, {1}, {})->set_bytes(64);
  e.mutable_instructions(0)->set_partitions(1);
  auto* op = half ? Op(e, 1, proto::VECTOR, proto::OP_COPY, {1}, {2}, {0})
                  : Op(e, 1, proto::VECTOR, proto::OP_ADD, {1, 2}, {2}, {0});
  op->set_elements(half ? 8 : 16), op->set_operand_count(half ? 1 : 2);
  auto* store = Op(e, 2, proto::DMA, proto::OP_STORE, {2}, {3}, {1});
  store->set_bytes(64), store->set_partitions(1);
  auto* x = e.add_inputs();
  x->set_name("x"), x->set_buffer(0);
  for (const char* name : {"y", "y_again"}) {
    if (!twice && name[1] != '\0') break;
    auto* y = e.add_outputs();
    y->set_name(name), y->set_buffer(3);
  }
  return e;
}

TEST(Executor, MemoryARunReadsBeforeWritingReadsZeroWhateverEarlierRunsLeft) {
  Executor exec(DeviceSpec::Default());
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i + 1);
  const auto input = HostTensor::FromFloats(proto::F32, {16}, x);
  for (bool twice : {true, false}) {
    for (int run = 0; run < 3; ++run) {  // each run leaves y's bytes behind
      EXPECT_EQ(exec.Run(ReadsUnwritten(false, twice), {{"x", input}})
                    .outputs.at("y")
                    .ToFloats(),
                x);
      const auto half = exec.Run(ReadsUnwritten(true, twice), {{"x", input}})
                            .outputs.at("y")
                            .ToFloats();
      for (int i = 0; i < 16; ++i)
        EXPECT_EQ(half[i], i < 8 ? x[i] : 0.0f) << twice << "," << run << "," << i;
    }
  }
}

}  // namespace
}  // namespace neuron::runtime

namespace neuron::runtime {
namespace {

// S = -x (a load of x, then negated in place; or computed from x in HBM
// when not `load`); y1 <- S (store); S = S + S; y2 <- S: a load whose
// buffer is written again and a store whose source is.
proto::Executable RewritesAfterCopies(bool load) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("rewrites");
  Buffer(e, 0, proto::HBM, 0, proto::F32, {16});    // x
  Buffer(e, 1, proto::SBUF, 0, proto::F32, {16});   // S
  Buffer(e, 2, proto::HBM, 128, proto::F32, {16});  // y1
  Buffer(e, 3, proto::HBM, 256, proto::F32, {16});  // y2
  auto dma = [&](std::uint32_t id, proto::Op op, std::uint32_t from, std::uint32_t to) {
    auto* i = Op(e, id, proto::DMA, op, {from}, {to}, {});
    i->set_bytes(64), i->set_partitions(1);
  };
  if (load) dma(0, proto::OP_LOAD, 0, 1);
  auto* neg = Op(e, 1, proto::VECTOR, proto::OP_NEG, {load ? 1u : 0u}, {1}, {});
  neg->set_elements(16), neg->set_operand_count(1);
  dma(2, proto::OP_STORE, 1, 2);
  auto* add = Op(e, 3, proto::VECTOR, proto::OP_ADD, {1, 1}, {1}, {});
  add->set_elements(16), add->set_operand_count(2);
  dma(4, proto::OP_STORE, 1, 3);
  auto* x = e.add_inputs();
  x->set_name("x"), x->set_buffer(0);
  for (auto [name, id] : {std::pair{"y1", 2u}, std::pair{"y2", 3u}}) {
    auto* y = e.add_outputs();
    y->set_name(name), y->set_buffer(id);
  }
  return e;
}

TEST(Executor, CopiesElidedOnTheHostKeepEveryValueAndLeaveTheInputsAlone) {
  std::vector<float> x(16), negated(16), doubled(16);
  for (int i = 0; i < 16; ++i) {
    x[i] = static_cast<float>(i) - 7.5f;
    negated[i] = -x[i];
    doubled[i] = -2 * x[i];
  }
  const auto input = HostTensor::FromFloats(proto::F32, {16}, x);
  Executor exec(DeviceSpec::Default());
  for (bool load : {true, false}) {
    // The caller's own bytes, read in place.
    const auto y = exec.Compute(RewritesAfterCopies(load), {{"x", HostView::Of(input)}});
    EXPECT_EQ(y.at("y1").ToFloats(), negated) << load;
    EXPECT_EQ(y.at("y2").ToFloats(), doubled) << load;
    EXPECT_EQ(input.ToFloats(), x) << load;
  }
}

}  // namespace
}  // namespace neuron::runtime

namespace neuron::runtime {
namespace {

// S = -x; out <- S (store); Q = -x[0:8] into out's second half; z <- S:
// out's block takes a later write, so S must not live in it.
proto::Executable LaterWriteIntoAStoredOutput() {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("later-write");
  Buffer(e, 0, proto::HBM, 0, proto::F32, {16});    // x
  Buffer(e, 1, proto::SBUF, 0, proto::F32, {16});   // S
  Buffer(e, 2, proto::HBM, 128, proto::F32, {16});  // out
  Buffer(e, 3, proto::HBM, 160, proto::F32, {8});   // Q: out's bytes 32..64
  Buffer(e, 4, proto::HBM, 256, proto::F32, {16});  // z
  Op(e, 0, proto::VECTOR, proto::OP_NEG, {0}, {1}, {})->set_elements(16);
  auto* store = Op(e, 1, proto::DMA, proto::OP_STORE, {1}, {2}, {});
  store->set_bytes(64), store->set_partitions(1);
  Op(e, 2, proto::VECTOR, proto::OP_NEG, {0}, {3}, {})->set_elements(8);
  auto* again = Op(e, 3, proto::DMA, proto::OP_STORE, {1}, {4}, {});
  again->set_bytes(64), again->set_partitions(1);
  for (int k : {0, 2}) e.mutable_instructions(k)->set_operand_count(1);
  auto* x = e.add_inputs();
  x->set_name("x"), x->set_buffer(0);
  for (auto [name, id] : {std::pair{"y", 2u}, std::pair{"z", 4u}}) {
    auto* y = e.add_outputs();
    y->set_name(name), y->set_buffer(id);
  }
  return e;
}

TEST(Executor, AStoreIsNotElidedIntoAnOutputWrittenAgainLater) {
  std::vector<float> x(16), y(16), z(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) + 1, z[i] = -x[i];
  for (int i = 0; i < 16; ++i) y[i] = i < 8 ? z[i] : z[i - 8];
  const auto r = Executor(DeviceSpec::Default())
                     .Run(LaterWriteIntoAStoredOutput(),
                          {{"x", HostTensor::FromFloats(proto::F32, {16}, x)}});
  EXPECT_EQ(r.outputs.at("y").ToFloats(), y);
  EXPECT_EQ(r.outputs.at("z").ToFloats(), z);
}

TEST(Executor, AConstantBoundAsAnOutputKeepsItsBytes) {
  proto::Executable e = LaterWriteIntoAStoredOutput();
  Buffer(e, 5, proto::HBM, 512, proto::F32, {4});
  const std::vector<float> c = {1.5f, -2.0f, 3.25f, 0.0f};
  auto* constant = e.add_constants();
  constant->set_buffer(5);
  constant->set_data(std::string(reinterpret_cast<const char*>(c.data()), 16));
  auto* out = e.add_outputs();
  out->set_name("c"), out->set_buffer(5);
  const auto r =
      Executor(DeviceSpec::Default())
          .Run(e, {{"x", HostTensor::FromFloats(proto::F32, {16},
                                                std::vector<float>(16, 1.0f))}});
  EXPECT_EQ(r.outputs.at("c").ToFloats(), c);
}

}  // namespace
}  // namespace neuron::runtime

namespace neuron::runtime {
namespace {

// What else a plan does around a matmul result copied out of PSUM.
enum class AroundPsum {
  kNothing,    // the result is computed in the copy's target
  kTouch,      // T (the target's bytes) = -A[0:4] between the matmul and the copy
  kReread,     // after the copy, T' (the target's bytes) = -A[0:4], then z = P x P
  kUnwritten,  // no matmul writes P: T as kTouch, then z = P x P, copy P
  kBias,       // not a copy: S = P + bias
  kBiasInS,    // S = P + (-bias), the negated bias made in S's bytes before the matmul
};

// y = A x B through PSUM (P) and a copy into S, then stored; y and t are
// returned twice, so S and T stay in the plan's memory.
proto::Executable MatmulThroughPsum(AroundPsum around) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("psum");
  Buffer(e, 0, proto::HBM, 0, proto::F32, {2, 3});     // A
  Buffer(e, 1, proto::HBM, 64, proto::F32, {3, 2});    // B
  Buffer(e, 2, proto::SBUF, 0, proto::F32, {2, 3});    // A, loaded
  Buffer(e, 3, proto::SBUF, 64, proto::F32, {3, 2});   // B, loaded
  Buffer(e, 4, proto::PSUM, 0, proto::F32, {2, 2});    // P
  Buffer(e, 5, proto::SBUF, 128, proto::F32, {2, 2});  // S
  Buffer(e, 6, proto::SBUF, 128, proto::F32, {4});     // T: S's bytes
  Buffer(e, 7, proto::HBM, 256, proto::F32, {2, 2});   // y
  Buffer(e, 8, proto::HBM, 320, proto::F32, {4});      // t
  Buffer(e, 9, proto::SBUF, 192, proto::F32, {2, 2});  // z
  Buffer(e, 10, proto::HBM, 384, proto::F32, {2, 2});  // z, returned
  Buffer(e, 11, proto::SBUF, 128, proto::F32, {4});    // T': S's bytes
  Buffer(e, 12, proto::PSUM, 64, proto::F32, {2, 2});  // z in PSUM
  Buffer(e, 13, proto::HBM, 448, proto::F32, {2});     // bias
  Buffer(e, 14, proto::SBUF, 224, proto::F32, {2});    // bias, loaded
  Buffer(e, 15, proto::SBUF, 136, proto::F32, {2});    // -bias, in S's bytes
  std::uint32_t k = 0;
  auto dma = [&](proto::Op op, std::uint32_t from, std::uint32_t to,
                 std::uint64_t bytes) {
    auto* i = Op(e, k++, proto::DMA, op, {from}, {to}, {});
    i->set_bytes(bytes), i->set_partitions(1);
  };
  auto unary = [&](proto::Op op, std::uint32_t from, std::uint32_t to) {
    auto* i = Op(e, k++, proto::VECTOR, op, {from}, {to}, {});
    i->set_elements(4), i->set_operand_count(1);
  };
  auto matmul = [&](std::uint32_t a, std::uint32_t b, std::uint32_t c, int inner) {
    auto* i = Op(e, k++, proto::TENSOR, proto::OP_MATMUL, {a, b}, {c}, {});
    i->set_m(2), i->set_k(inner), i->set_n(2);
  };
  auto z = [&] {
    matmul(4, 4, 12, 2);
    unary(proto::OP_COPY, 12, 9);
    dma(proto::OP_STORE, 9, 10, 16);
  };
  std::vector<std::string> outputs = {"y", "y_again"};
  const bool bias = around == AroundPsum::kBias || around == AroundPsum::kBiasInS;
  const std::uint32_t bias_at = around == AroundPsum::kBias ? 14 : 15;
  dma(proto::OP_LOAD, 0, 2, 24);
  dma(proto::OP_LOAD, 1, 3, 24);
  if (bias) dma(proto::OP_LOAD, 13, 14, 8);
  if (around == AroundPsum::kBiasInS) {
    auto* neg = Op(e, k++, proto::VECTOR, proto::OP_NEG, {14}, {15}, {});
    neg->set_elements(2), neg->set_operand_count(1);
  }
  if (around != AroundPsum::kUnwritten) matmul(2, 3, 4, 3);
  if (around == AroundPsum::kTouch || around == AroundPsum::kUnwritten) {
    unary(proto::OP_NEG, 2, 6);
    dma(proto::OP_STORE, 6, 8, 16);
    outputs.insert(outputs.end(), {"t", "t_again"});
  }
  if (around == AroundPsum::kUnwritten) z();
  if (bias) {
    auto* add = Op(e, k++, proto::VECTOR, proto::OP_ADD, {4, bias_at}, {5}, {});
    add->set_elements(4), add->set_operand_count(2);
  } else {
    unary(proto::OP_COPY, 4, 5);
  }
  dma(proto::OP_STORE, 5, 7, 16);
  if (around == AroundPsum::kReread) {
    unary(proto::OP_NEG, 2, 11);
    z();
  }
  if (around == AroundPsum::kReread || around == AroundPsum::kUnwritten)
    outputs.push_back("z");
  for (auto [name, id] :
       {std::pair{"A", 0u}, std::pair{"B", 1u}, std::pair{"bias", 13u}}) {
    if (id == 13 && !bias) break;
    auto* in = e.add_inputs();
    in->set_name(name), in->set_buffer(id);
  }
  for (const auto& name : outputs) {
    auto* out = e.add_outputs();
    out->set_name(name), out->set_buffer(name[0] == 'y' ? 7 : name[0] == 't' ? 8 : 10);
  }
  return e;
}

TEST(Executor, AMatmulResultCopiedOutOfPsumKeepsItsValueWhateverElseUsesTheBytes) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {0.5f, -1, 2, 0.25f, -3, 1};
  auto product = [](const std::vector<float>& x, const std::vector<float>& w, int inner) {
    std::vector<float> c(4, 0.0f);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int p = 0; p < inner; ++p) c[i * 2 + j] += x[i * inner + p] * w[p * 2 + j];
    return c;
  };
  const std::vector<float> y = product(a, b, 3), zero(4, 0.0f), bias = {10, 20};
  std::vector<float> y_bias = y, y_less = y;
  for (int i = 0; i < 4; ++i) y_bias[i] += bias[i % 2], y_less[i] -= bias[i % 2];
  Executor exec(DeviceSpec::Default());
  for (auto around : {AroundPsum::kNothing, AroundPsum::kTouch, AroundPsum::kReread,
                      AroundPsum::kUnwritten, AroundPsum::kBias, AroundPsum::kBiasInS}) {
    std::map<std::string, HostTensor> inputs = {
        {"A", HostTensor::FromFloats(proto::F32, {2, 3}, a)},
        {"B", HostTensor::FromFloats(proto::F32, {3, 2}, b)}};
    const bool added = around == AroundPsum::kBias || around == AroundPsum::kBiasInS;
    if (added) inputs["bias"] = HostTensor::FromFloats(proto::F32, {2}, bias);
    const auto r = exec.Run(MatmulThroughPsum(around), inputs);
    const int at = static_cast<int>(around);
    const bool unwritten = around == AroundPsum::kUnwritten;
    const bool less = around == AroundPsum::kBiasInS;
    EXPECT_EQ(r.outputs.at("y").ToFloats(), unwritten ? zero
                                            : less    ? y_less
                                            : added   ? y_bias
                                                      : y)
        << at;
    if (r.outputs.count("t")) {
      EXPECT_EQ(r.outputs.at("t").ToFloats(), (std::vector<float>{-1, -2, -3, -4})) << at;
    }
    if (r.outputs.count("z")) {
      EXPECT_EQ(r.outputs.at("z").ToFloats(), unwritten ? zero : product(y, y, 2)) << at;
    }
  }
}

}  // namespace
}  // namespace neuron::runtime
