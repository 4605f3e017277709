// Fuzzing the runtime's parsers: topology and device spec text files, the
// executable file format, operation traces. Every mutated input is accepted
// as valid or refused with neuron::Error; nothing crashes, aborts or hangs.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "../helpers/mutator.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {
namespace {

std::string Source(const std::string& path) {
  return ReadFile(std::string(NEURON_SOURCE_DIR) + "/" + path, "fuzz seed");
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/parser_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

TEST(ParserFuzz, Topology) {
  for (const char* file : {"configs/topologies/trn2-node.textproto",
                           "configs/topologies/trn2-ultraserver.textproto"}) {
    neuron::testing::Fuzz(file, Source(file), [](const std::string& text) {
      const Topology t = Topology::FromText(text, "fuzz");
      // An accepted topology builds its fabric and places a job, or says why not.
      CheckRoutes(t, 1, {std::min<std::uint32_t>(t.spec().chips_per_node(), 4)});
    });
  }
}

TEST(ParserFuzz, DeviceSpec) {
  neuron::testing::Fuzz("device spec", Source("configs/devices/neuroncore-v3.textproto"),
                        [](const std::string& text) { DeviceSpec::FromText(text, "fuzz"); });
}

TEST(ParserFuzz, OperationTrace) {
  // One rank's trace of a 1-rank job: a step of compute and an allreduce.
  OpTrace trace;
  trace.Mark("step_begin");
  trace.Compute(SimDuration(5));
  const std::uint64_t issue = trace.Issue(false, true);
  proto::TraceCollective c;
  c.set_kind("allreduce");
  c.add_group(0);
  c.set_communicator("world");
  c.set_sequence(1);
  c.set_bytes(1024);
  trace.AddCollective(issue, c);
  trace.Wait(issue);
  trace.Compute(SimDuration(7));
  trace.Mark("step_end");
  proto::TraceLayout layout;
  layout.set_tp(1);
  layout.set_pp(1);
  layout.set_dp(1);
  const std::string path = TempPath("trace.pb");
  trace.Save(path, 0, 1, layout);
  const Topology topology = Topology::Default();
  const FabricModel model(topology, PlaceRanks(topology, {1}));
  // Damaged files are refused by their checksum; mutated traces behind a
  // valid frame reach the replay, which must refuse what it cannot run.
  neuron::testing::Fuzz("operation trace", LoadRankTrace(path).SerializeAsString(),
                        [&](const std::string& bytes) {
                          proto::RankTrace mutated;
                          if (!mutated.ParseFromString(bytes)) throw IoError("not a trace");
                          SaveRankTrace(mutated, path);
                          ReplayTraces({LoadRankTrace(path)}, model);
                        });
  std::string bytes = ReadFile(path, "trace");
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THROW(LoadRankTrace(path), IoError);
  std::remove(path.c_str());
}

TEST(ParserFuzz, ExecutableFile) {
  // The file's frame and checksum refuse raw damage; the contents behind a
  // valid frame are fuzzed by re-saving mutated protos.
  const DeviceSpec device = DeviceSpec::Default();
  proto::Executable seed;
  seed.set_format_version(kExecutableFormatVersion);
  seed.set_device(device.spec().name());
  auto* b = seed.add_buffers();
  b->set_id(0);
  b->set_bytes(64);
  b->set_space(proto::HBM);
  const std::string path = TempPath("exe.nexe");
  const std::string seed_bytes = seed.SerializeAsString();
  neuron::testing::Fuzz("executable", seed_bytes, [&](const std::string& bytes) {
    proto::Executable e;
    if (!e.ParseFromString(bytes)) throw InvalidUsage("not a protobuf");
    SaveExecutable(e, path);
    LoadExecutable(path, device);
  });
  std::remove(path.c_str());
}

}  // namespace
}  // namespace neuron::runtime
