// Executables (the compiler-runtime contract): validation, the framed file
// format, and the modelled timeline of a plan on the NeuronCore's engines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/plan_timing.h"
#include "error_of.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

proto::Buffer* AddBuffer(proto::Executable& e, std::uint32_t id, proto::MemorySpace space,
                         std::uint64_t offset, std::uint64_t bytes,
                         proto::ElementType dtype = proto::BF16) {
  auto* b = e.add_buffers();
  b->set_id(id);
  b->set_name("b" + std::to_string(id));
  b->set_space(space);
  b->set_offset(offset);
  b->set_bytes(bytes);
  b->set_dtype(dtype);
  return b;
}

proto::Instruction* Add(proto::Executable& e, std::uint32_t id, proto::EngineKind engine,
                        proto::Op op, std::vector<std::uint32_t> deps) {
  auto* i = e.add_instructions();
  i->set_id(id);
  i->set_engine(engine);
  i->set_op(op);
  for (auto d : deps) i->add_deps(d);
  return i;
}

// load lhs, load rhs -> matmul -> vector add (+ bias) -> store; plus an
// independent scalar op that overlaps the loads.
proto::Executable SmallPlan() {
  proto::Executable e;
  e.set_format_version(kExecutableFormatVersion);
  e.set_name("test/forward/0");
  AddBuffer(e, 0, proto::HBM, 0, 128 * 128 * 2);
  AddBuffer(e, 1, proto::HBM, 1 << 20, 128 * 512 * 2);
  AddBuffer(e, 2, proto::SBUF, 0, 128 * 128 * 2);
  AddBuffer(e, 3, proto::SBUF, 1 << 16, 128 * 512 * 2);
  AddBuffer(e, 4, proto::PSUM, 0, 128 * 512 * 4, proto::F32);
  AddBuffer(e, 5, proto::HBM, 2 << 20, 128 * 512 * 4, proto::F32);
  auto* l0 = Add(e, 0, proto::DMA, proto::OP_LOAD, {});
  l0->set_bytes(128 * 128 * 2), l0->set_partitions(128), l0->add_inputs(0),
      l0->add_outputs(2);
  auto* l1 = Add(e, 1, proto::DMA, proto::OP_LOAD, {});
  l1->set_bytes(128 * 512 * 2), l1->set_partitions(128), l1->add_inputs(1),
      l1->add_outputs(3);
  auto* mm = Add(e, 2, proto::TENSOR, proto::OP_MATMUL, {0, 1});
  mm->set_m(128), mm->set_k(128), mm->set_n(512), mm->add_inputs(2), mm->add_inputs(3);
  mm->add_outputs(4);
  auto* add = Add(e, 3, proto::VECTOR, proto::OP_ADD, {2});
  add->set_elements(128 * 512), add->set_operand_count(2), add->add_inputs(4),
      add->add_outputs(4);
  auto* st = Add(e, 4, proto::DMA, proto::OP_STORE, {3});
  st->set_bytes(128 * 512 * 4), st->set_partitions(128), st->set_spill(true);
  st->add_inputs(4), st->add_outputs(5);
  auto* side = Add(e, 5, proto::SCALAR, proto::OP_EXP, {});
  side->set_elements(128 * 64), side->set_operand_count(1), side->add_inputs(2);
  side->add_outputs(2);
  auto* in = e.add_inputs();
  in->set_name("x"), in->set_buffer(0);
  auto* out = e.add_outputs();
  out->set_name("y"), out->set_buffer(5);
  return e;
}

using testing::ErrorOf;

TEST(PlanTiming, InstructionsWaitForTheirEngineAndDependencies) {
  const CostModel model(DeviceSpec::Default());
  const proto::Executable e = SmallPlan();
  ValidateExecutable(e, model.device());
  const PlanTiming t = TimePlan(e, model);
  const SimDuration load0 = model.Dma(128 * 128 * 2, 128),
                    load1 = model.Dma(128 * 512 * 2, 128);
  const SimDuration mm = model.Matmul(128, 128, 512, false).time;
  const SimDuration add = model.Elementwise(Engine::kVector, 128 * 512, 2, true);
  const SimDuration store = model.Dma(128 * 512 * 4, 128);
  // The two loads share the DMA engine, the second starting as the first's
  // bytes are moved (its latency overlaps); the chain follows; the scalar
  // op overlaps the loads and adds nothing.
  const SimDuration latency = model.DmaLatency();
  EXPECT_NEAR(t.schedule[1].start.count(), (load0 - latency).count(), 1e-9);
  EXPECT_NEAR(t.total.count(), (load0 - latency + load1 + mm + add + store).count(),
              1e-9);
  EXPECT_NEAR(t.schedule[5].start.count(), 0.0, 1e-12);
  EXPECT_NEAR(t.busy[static_cast<int>(Engine::kDma)].count(),
              (load0 + load1 + store - 3 * latency).count(), 1e-9);
  EXPECT_NEAR(t.utilisation[static_cast<int>(Engine::kTensor)], mm / t.total, 1e-12);
  EXPECT_EQ(t.tensor_cycles, 512u);
  EXPECT_DOUBLE_EQ(t.flops, 2.0 * 128 * 128 * 512);
  EXPECT_NEAR(t.mfu, model.Mfu(t.flops, t.total, false), 1e-12);
  EXPECT_EQ(t.hbm_bytes, 128u * 128 * 2 + 128 * 512 * 2 + 128 * 512 * 4);
  EXPECT_EQ(t.spill_bytes, 128u * 512 * 4);
  const std::string trace = ::testing::TempDir() + "plan_trace.json";
  WriteChromeTrace(t, e.name(), trace);
  std::ifstream in(trace);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"name\":\"matmul #2\""), std::string::npos);
  EXPECT_NE(text.str().find("\"args\":{\"name\":\"tensor\"}"), std::string::npos);
  // A link planted at the trace's name is refused, its target untouched.
  const std::string victim = ::testing::TempDir() + "plan_trace_victim";
  std::ofstream(victim) << "precious";
  std::remove(trace.c_str());
  ASSERT_EQ(::symlink(victim.c_str(), trace.c_str()), 0);
  EXPECT_NE(ErrorOf([&] { WriteChromeTrace(t, e.name(), trace); })
                .find(trace + ": it is a symbolic link, not followed"),
            std::string::npos);
  std::ifstream kept(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "precious");
  std::remove(trace.c_str());
  std::remove(victim.c_str());
}

TEST(Executable, ValidationNamesTheExecutableAndWhatIsWrong) {
  const DeviceSpec device = DeviceSpec::Default();
  auto broken = [&](const std::function<void(proto::Executable&)>& change) {
    proto::Executable e = SmallPlan();
    change(e);
    return ErrorOf([&] { ValidateExecutable(e, device); });
  };
  EXPECT_NE(
      broken([](auto& e) {
        e.set_format_version(7);
      }).find("executable 'test/forward/0': format version 7, this runtime reads 4"),
      std::string::npos);
  EXPECT_NE(broken([](auto& e) { e.mutable_instructions(2)->add_deps(4); })
                .find("instruction 2 (matmul): depends on instruction 4, which is not an "
                      "earlier"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_instructions(3)->add_inputs(99);
            }).find("instruction 3 (add): input buffer 99 does not exist"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_instructions(3)->clear_op();
            }).find("instruction 3 (op 0): unknown op 0"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              auto* sub = e.mutable_instructions(3)->add_fused();
              sub->set_op(proto::OP_MATMUL);
              sub->add_inputs(2);
            }).find("instruction 3 (add): only a fused instruction has fused ops"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_buffers(2)->set_offset(28u << 20);
            }).find("exceeds SBUF's 29360128 bytes on neuroncore-v3"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_buffers(3)->set_id(2);
            }).find("buffer id 2 is used twice"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_instructions(0)->set_partitions(0);
            }).find("a DMA needs partitions > 0"),
            std::string::npos);
  EXPECT_NE(broken([](auto& e) {
              e.mutable_outputs(0)->set_buffer(42);
            }).find("binding 'y' names buffer 42"),
            std::string::npos);
}

TEST(Executable, FilesRoundTripAndDamageIsDetected) {
  const DeviceSpec device = DeviceSpec::Default();
  const std::string path = ::testing::TempDir() + "plan.nexe";
  const proto::Executable e = SmallPlan();
  SaveExecutable(e, path);
  EXPECT_EQ(LoadExecutable(path, device).SerializeAsString(), e.SerializeAsString());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    bytes = s.str();
  }
  auto write = [&](const std::string& content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
  };
  write(bytes.substr(0, bytes.size() - 5));
  EXPECT_NE(ErrorOf([&] { LoadExecutable(path, device); }).find("truncated or padded"),
            std::string::npos);
  // A bit flipped in any byte of the payload (after the 24-byte header), in
  // any of the checksum's four lanes or its tail, is caught.
  ASSERT_GT(bytes.size(), 24u + 4 * 32 + 7);
  for (std::size_t i = 24; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] ^= 0x40;
    write(flipped);
    const std::string error = ErrorOf([&] { LoadExecutable(path, device); });
    EXPECT_NE(error.find("corrupt (checksum mismatch)"), std::string::npos)
        << "byte " << i;
  }
  write("plain text that is not an executable at all");
  EXPECT_NE(ErrorOf([&] { LoadExecutable(path, device); }).find("bad magic"),
            std::string::npos);
  write("NEX");
  EXPECT_NE(ErrorOf([&] { LoadExecutable(path, device); }).find("truncated"),
            std::string::npos);
  std::remove(path.c_str());
}

TEST(Executable, AFileOfAnotherFormatSaysWhichWhenItDoesNotParse) {
  const DeviceSpec device = DeviceSpec::Default();
  const std::string path = ::testing::TempDir() + "old.nexe";
  // A payload this runtime cannot parse (fused ops nested beyond
  // protobuf's depth limit) from a format-1 writer.
  proto::Executable e = SmallPlan();
  e.set_format_version(1);
  proto::Instruction* nested = e.mutable_instructions(0);
  for (int depth = 0; depth < 120; ++depth) nested = nested->add_fused();
  SaveExecutable(e, path);
  const std::string error = ErrorOf([&] { LoadExecutable(path, device); });
  EXPECT_NE(error.find("old.nexe: format version 1, this runtime reads " +
                       std::to_string(kExecutableFormatVersion)),
            std::string::npos)
      << error;
  EXPECT_NE(ErrorOf([&] { LoadExecutableShared(path, device); }).find("format version 1"),
            std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace neuron::runtime
