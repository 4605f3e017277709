// The executor's strided_copy against an element-by-element reference:
// permutes (the attention's head split), transposes (in tiles, edges
// included), expands, writes at output strides and offsets, unit
// dimensions and contiguous views, runs of whole 64-byte chunks, and
// elements of 1, 2, 4 and 8 bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"
#include "sbuf_buffer.h"

namespace neuron::runtime {
namespace {

struct Case {
  std::vector<std::int64_t> sizes, in_strides;
  std::int64_t in_offset = 0;
  std::vector<std::int64_t> out_strides;  // empty: contiguous
  std::int64_t out_offset = 0;
  std::int64_t in_elements = 0, out_elements = 0;
};

using testing::AddBuffer;

// The input's bytes: each distinct, so a misplaced byte shows.
HostTensor Input(proto::ElementType dtype, std::int64_t n) {
  HostTensor t;
  t.dtype = dtype, t.shape = {n};
  t.data.resize(static_cast<std::size_t>(n) * ElementBytes(dtype));
  for (std::size_t k = 0; k < t.data.size(); ++k)
    t.data[k] = static_cast<std::uint8_t>(k * 7 + 3);
  if (dtype == proto::BOOL) {
    for (auto& b : t.data) b &= 1;
  }
  return t;
}

HostBytes RunCopy(const Case& c, const HostTensor& x) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("strided-copy");
  AddBuffer(e, 0, 0, x.dtype, c.in_elements);
  AddBuffer(e, 1, 1 << 20, x.dtype, c.out_elements);  // apart from the input
  auto* i = e.add_instructions();
  i->set_id(0), i->set_op(proto::OP_STRIDED_COPY), i->set_engine(proto::VECTOR);
  i->add_inputs(0), i->add_outputs(1), i->set_operand_count(1);
  std::int64_t n = 1;
  for (auto s : c.sizes) i->add_view_sizes(s), n *= s;
  for (auto s : c.in_strides) i->add_in_strides(s);
  for (auto s : c.out_strides) i->add_out_strides(s);
  i->set_in_offset(c.in_offset), i->set_out_offset(c.out_offset), i->set_elements(n);
  auto* in = e.add_inputs();
  in->set_name("x"), in->set_buffer(0);
  auto* out = e.add_outputs();
  out->set_name("y"), out->set_buffer(1);
  return Executor(DeviceSpec::Default()).Run(e, {{"x", x}}).outputs.at("y").data;
}

// Element by element; the output's other elements are zero (a plan's
// memory reads zero before it is written).
HostBytes Reference(const Case& c, const HostTensor& x) {
  const std::size_t w = ElementBytes(x.dtype);
  HostBytes y(static_cast<std::size_t>(c.out_elements) * w, 0);
  const int rank = static_cast<int>(c.sizes.size());
  std::vector<std::int64_t> out_strides = c.out_strides;
  if (out_strides.empty()) {
    out_strides.assign(rank, 1);
    for (int d = rank - 2; d >= 0; --d)
      out_strides[d] = out_strides[d + 1] * c.sizes[d + 1];
  }
  std::vector<std::int64_t> index(rank, 0);
  for (bool more = true; more;) {
    std::int64_t src = c.in_offset, dst = c.out_offset;
    for (int d = 0; d < rank; ++d)
      src += index[d] * c.in_strides[d], dst += index[d] * out_strides[d];
    std::memcpy(y.data() + dst * w, x.data.data() + src * w, w);
    more = false;
    for (int d = rank - 1; d >= 0 && !more; --d) {
      more = ++index[d] < c.sizes[d];
      if (!more) index[d] = 0;
    }
  }
  return y;
}

TEST(ExecutorCopy, StridedCopiesMoveEveryElementWhereTheViewSays) {
  const std::map<std::string, Case> cases = {
      // qkv [s 3, b 2, heads 2, 3, hd 5] .permute(3, 1, 2, 0, 4)[1]
      {"head split", {{2, 2, 3, 5}, {30, 15, 60, 1}, 5, {}, 0, 180, 60}},
      // and back: [b, heads, s, hd] -> [s, b, heads, hd]
      {"head merge", {{3, 2, 2, 5}, {5, 30, 15, 1}, 0, {}, 0, 60, 60}},
      {"transpose", {{4, 7}, {1, 4}, 0, {}, 0, 28, 28}},
      // k^T: [b 3, s 20, hd 18] -> [3, 18, 20]
      {"transposes in a batch", {{3, 18, 20}, {360, 1, 18}, 0, {}, 0, 1080, 1080}},
      // past L1 (but for 1-byte elements): in 16 x 16 tiles, edges included
      {"a large transpose", {{150, 131}, {1, 150}, 0, {}, 0, 19650, 19650}},
      {"large transposes in a batch",
       {{2, 100, 90}, {9000, 1, 100}, 0, {}, 0, 18000, 18000}},
      {"a large transpose into a block of the output",
       {{130, 140}, {1, 130}, 0, {150, 1}, 3, 18200, 19500}},
      {"expand", {{3, 4, 6}, {0, 6, 1}, 0, {}, 0, 24, 72}},
      {"into a block of the output", {{3, 5}, {5, 1}, 0, {8, 1}, 9, 15, 32}},
      {"a transposed block of the output", {{3, 5}, {1, 3}, 0, {1, 6}, 2, 15, 40}},
      {"unit dimensions, contiguous", {{1, 6, 1, 8}, {48, 8, 8, 1}, 0, {}, 0, 48, 48}},
      {"runs of whole chunks", {{3, 2, 32}, {100, 40, 1}, 4, {}, 0, 300, 192}},
      {"one element", {{}, {}, 3, {}, 0, 5, 1}},
  };
  for (auto dtype : {proto::F32, proto::F16, proto::BOOL, proto::I64}) {
    for (const auto& [name, c] : cases) {
      const HostTensor x = Input(dtype, c.in_elements);
      EXPECT_EQ(RunCopy(c, x), Reference(c, x))
          << name << ", " << proto::ElementType_Name(dtype);
    }
  }
}

}  // namespace
}  // namespace neuron::runtime

namespace neuron::runtime {
namespace {

// x's even elements (and with `odd`, its odd ones too) copied at output
// strides into an SBUF value P, which is copied out: two interleaved
// strided copies write all of P, one writes half.
proto::Executable Interleaved(bool odd) {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion), e.set_name("interleaved");
  testing::AddBuffer(e, 0, 0, proto::F32, 16);     // x
  testing::AddBuffer(e, 1, 4096, proto::F32, 16);  // P
  testing::AddBuffer(e, 2, 8192, proto::F32, 16);  // y
  for (int half = 0; half < (odd ? 2 : 1); ++half) {
    auto* i = e.add_instructions();
    i->set_id(static_cast<std::uint32_t>(half)), i->set_op(proto::OP_STRIDED_COPY);
    i->set_engine(proto::VECTOR), i->add_inputs(0), i->add_outputs(1);
    i->set_operand_count(1), i->set_elements(8);
    i->add_view_sizes(8), i->add_in_strides(2), i->add_out_strides(2);
    i->set_in_offset(half), i->set_out_offset(half);
  }
  auto* copy = e.add_instructions();
  copy->set_id(2), copy->set_op(proto::OP_COPY), copy->set_engine(proto::VECTOR);
  copy->add_inputs(1), copy->add_outputs(2), copy->set_operand_count(1);
  copy->set_elements(16);
  for (int k = 0; k < e.instructions_size() - 1; ++k)
    copy->add_deps(static_cast<std::uint32_t>(k));
  auto* in = e.add_inputs();
  in->set_name("x"), in->set_buffer(0);
  auto* out = e.add_outputs();
  out->set_name("y"), out->set_buffer(2);
  return e;
}

// The executor zeroes what a run reads before writing it: the elements a
// strided copy writes at output strides count as written, those between
// them do not, whatever an earlier run left there.
TEST(ExecutorCopy, ElementsBetweenAStridedCopysWritesReadZero) {
  Executor exec(DeviceSpec::Default());
  std::vector<float> x(16);
  for (int k = 0; k < 16; ++k) x[k] = static_cast<float>(k + 1);
  const auto input = HostTensor::FromFloats(proto::F32, {16}, x);
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(exec.Run(Interleaved(true), {{"x", input}}).outputs.at("y").ToFloats(), x);
    const auto half =
        exec.Run(Interleaved(false), {{"x", input}}).outputs.at("y").ToFloats();
    for (int k = 0; k < 16; ++k)
      EXPECT_EQ(half[k], k % 2 == 0 ? x[k] : 0.0f) << run << "," << k;
  }
}

}  // namespace
}  // namespace neuron::runtime
