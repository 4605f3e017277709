#include "neuron/runtime/device/executable.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "neuron/runtime/device/custom_kernels.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/fnv.h"

namespace neuron::runtime {
namespace {

// The file: "NEXE", format version, payload size, checksum of the payload,
// then the serialised Executable. The frame makes a truncated or corrupt
// file an error instead of a plan protobuf would half-accept.
constexpr char kMagic[4] = {'N', 'E', 'X', 'E'};
struct FileHeader {
  char magic[4];
  std::uint32_t version;
  std::uint64_t size;
  std::uint64_t checksum;
};

// The payload's checksum (file format 3): FNV-1a's multiply over 8-byte
// words in four independent lanes (word i goes to lane i % 4, so the lanes'
// multiplies overlap: 2.6 -> 0.9 us for an 11 KB plan), the lanes folded
// together, then the words and bytes of the tail.
std::uint64_t Checksum(const char* data, std::size_t bytes) {
  constexpr std::uint64_t kPrime = 1099511628211ull;
  auto step = [](std::uint64_t h, std::uint64_t word) {
    h = (h ^ word) * kPrime;
    return h ^ (h >> 29);
  };
  std::uint64_t lanes[4] = {1469598103934665603ull, 1469598103934665603ull ^ 1,
                            1469598103934665603ull ^ 2, 1469598103934665603ull ^ 3};
  std::size_t i = 0;
  for (; i + sizeof(lanes) <= bytes; i += sizeof(lanes)) {
    for (int l = 0; l < 4; ++l) {
      std::uint64_t word;
      std::memcpy(&word, data + i + 8 * l, 8);
      lanes[l] = step(lanes[l], word);
    }
  }
  std::uint64_t h = lanes[0];
  for (int l = 1; l < 4; ++l) h = step(h, lanes[l]);
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, 8);
    h = step(h, word);
  }
  return h ^ Fnv1a(data + i, bytes - i);
}

std::uint64_t Capacity(proto::MemorySpace space, const DeviceSpec& device) {
  switch (space) {
    case proto::HBM:
      return device.HbmBytes();
    case proto::SBUF:
      return device.SbufBytes();
    case proto::PSUM:
      return device.PsumBytes();
    default:
      return 0;
  }
}

}  // namespace

namespace {

// A set of ids: flags for ids below four times the expected count, a hash
// set beyond (ids need not be dense, only unique).
class IdSet {
 public:
  explicit IdSet(int expected) : flags_(4 * static_cast<std::size_t>(std::max(expected, 1))) {}
  bool Insert(std::uint32_t id) {
    if (id < flags_.size()) {
      if (flags_[id]) return false;
      flags_[id] = true;
      return true;
    }
    return others_.insert(id).second;
  }
  bool Contains(std::uint32_t id) const {
    return id < flags_.size() ? flags_[id] : others_.count(id) > 0;
  }

 private:
  std::vector<bool> flags_;
  std::unordered_set<std::uint32_t> others_;
};

}  // namespace

namespace {

// A device op's engine (DMA ops on the DMA engine and matmul on the tensor
// engine, only) and cost parameters.
template <typename What>
void CheckEngineAndCost(const proto::Instruction& i, const DeviceOp& op, const What& what) {
  NEURON_CHECK(op.dma == (i.engine() == proto::DMA) &&
                   (i.op() == proto::OP_MATMUL) == (i.engine() == proto::TENSOR),
               what(), ": not an op of engine ", proto::EngineKind_Name(i.engine()));
  NEURON_CHECK(i.engine() != proto::ENGINE_UNSPECIFIED, what(), ": no engine");
  switch (i.engine()) {
    case proto::TENSOR:
      NEURON_CHECK(i.m() >= 0 && i.k() >= 0 && i.n() >= 0, what(),
                   ": negative matmul shape ", i.m(), "x", i.k(), "x", i.n());
      break;
    case proto::DMA:
      NEURON_CHECK(i.partitions() > 0, what(), ": a DMA needs partitions > 0");
      break;
    default:
      NEURON_CHECK(i.elements() >= 0 && i.operand_count() >= 1, what(),
                   ": needs elements >= 0 "
                   "and operand_count >= 1, got ",
                   i.elements(), " and ", i.operand_count());
  }
}

// Instruction `i` of the executable `where`: a registered op on its
// engine, existing buffers, dependencies on earlier instructions only
// (`earlier`), sound cost parameters, fused sub-ops reading its inputs.
void CheckInstruction(const proto::Instruction& i, const std::string& where,
                      const IdSet& buffers, const IdSet& earlier) {
  // Built only for a message: validation runs on every cache load.
  const auto what = [&] {
    return StrCat(where, ": instruction ", i.id(), " (", DeviceOpName(i.op()), ")");
  };
  NEURON_CHECK(!earlier.Contains(i.id()), what(), ": id used twice");
  const DeviceOp* op = FindDeviceOp(i.op());
  NEURON_CHECK(op != nullptr, what(), ": unknown op ", static_cast<int>(i.op()),
               " (device_ops.h lists the device's)");
  if (i.op() == proto::OP_CUSTOM_KERNEL) {  // on the engines it names, for its time
    CheckCustomKernelInstruction(i, what());
  } else {
    CheckEngineAndCost(i, *op, what);
  }
  for (auto b : i.inputs())
    NEURON_CHECK(buffers.Contains(b), what(), ": input buffer ", b, " does not exist");
  for (auto b : i.outputs())
    NEURON_CHECK(buffers.Contains(b), what(), ": output buffer ", b, " does not exist");
  for (auto d : i.deps()) {
    NEURON_CHECK(earlier.Contains(d), what(), ": depends on instruction ", d,
                 ", which is not an earlier instruction");
  }
  NEURON_CHECK(i.op() == proto::OP_FUSED || i.fused().empty(), what(),
               ": only a fused instruction has fused ops");
  for (const auto& sub : i.fused()) {
    const DeviceOp* row = FindDeviceOp(sub.op());
    NEURON_CHECK(row != nullptr && row->fusible && sub.inputs_size() >= 1, what(),
                 ": fused op ", DeviceOpName(sub.op()),
                 " is not an elementwise op with inputs");
    for (auto b : sub.inputs()) {
      NEURON_CHECK(b == kFusedPrevious || std::find(i.inputs().begin(), i.inputs().end(),
                                                    b) != i.inputs().end(),
                   what(), ": fused op ", DeviceOpName(sub.op()), " reads buffer ", b,
                   ", which is not an input of the instruction");
    }
  }
}

}  // namespace

void ValidateExecutable(const proto::Executable& e, const DeviceSpec& device) {
  const std::string where = StrCat("executable '", e.name(), "'");
  NEURON_CHECK(e.format_version() == kExecutableFormatVersion, where, ": format version ",
               e.format_version(), ", this runtime reads ", kExecutableFormatVersion);
  // Ids are small and dense in plans the compiler makes: flags by id.
  IdSet buffers(e.buffers_size());
  for (const auto& b : e.buffers()) {
    NEURON_CHECK(buffers.Insert(b.id()), where, ": buffer id ", b.id(), " is used twice");
    NEURON_CHECK(b.space() != proto::MEMORY_SPACE_UNSPECIFIED, where, ": buffer ", b.id(),
                 " (", b.name(), ") has no memory space");
    const std::uint64_t capacity = Capacity(b.space(), device);
    NEURON_CHECK(
        b.offset() + b.bytes() <= capacity && b.offset() + b.bytes() >= b.offset(), where,
        ": buffer ", b.id(), " (", b.name(), ") at ", b.offset(), " + ", b.bytes(),
        " bytes exceeds ", proto::MemorySpace_Name(b.space()), "'s ", capacity,
        " bytes on ", device.spec().name());
  }
  IdSet earlier(e.instructions_size());
  for (const auto& i : e.instructions()) {
    CheckInstruction(i, where, buffers, earlier);
    earlier.Insert(i.id());
  }
  for (const auto* bindings : {&e.inputs(), &e.outputs()}) {
    for (const auto& b : *bindings) {
      NEURON_CHECK(buffers.Contains(b.buffer()), where, ": binding '", b.name(),
                   "' names buffer ", b.buffer(), ", which does not exist");
    }
  }
  for (const auto& c : e.constants()) {
    NEURON_CHECK(buffers.Contains(c.buffer()), where, ": a constant names buffer ",
                 c.buffer(), ", which does not exist");
  }
}

namespace {

// The checked payload of an executable file: header, size and checksum;
// InvalidUsage names the path.
std::pair<const char*, std::size_t> Payload(const std::string& bytes, const std::string& path) {
  FileHeader h;
  NEURON_CHECK(bytes.size() >= sizeof(h), "executable ", path, ": truncated (",
               bytes.size(), " bytes, shorter than the header)");
  std::memcpy(&h, bytes.data(), sizeof(h));
  NEURON_CHECK(std::memcmp(h.magic, kMagic, 4) == 0, "executable ", path,
               ": not an executable file (bad magic)");
  NEURON_CHECK(h.version == kExecutableFileVersion, "executable ", path,
               ": file format ", h.version, ", this runtime reads ", kExecutableFileVersion);
  NEURON_CHECK(bytes.size() - sizeof(h) == h.size, "executable ", path,
               ": truncated or padded (", bytes.size() - sizeof(h),
               " payload bytes, the header says ", h.size, ")");
  const char* payload = bytes.data() + sizeof(h);  // no copy of what may be megabytes
  NEURON_CHECK(Checksum(payload, h.size) == h.checksum, "executable ", path,
               ": corrupt (checksum mismatch)");
  return {payload, h.size};
}

// Why a payload does not parse: another format version, or damage.
std::string WhyNotParsed(const char* payload, std::size_t size, const std::string& path) {
  proto::ExecutableVersion version;
  if (version.ParseFromArray(payload, static_cast<int>(size)) &&
      version.format_version() != kExecutableFormatVersion) {
    return StrCat("executable ", path, ": format version ", version.format_version(),
                  ", this runtime reads ", kExecutableFormatVersion);
  }
  return StrCat("executable ", path, ": corrupt (does not parse)");
}

}  // namespace

namespace {

// Checks, parses into `e` and validates the bytes of executable file `path`.
void ParseInto(const std::string& bytes, const std::string& path, const DeviceSpec& device,
               proto::Executable* e) {
  const auto [payload, size] = Payload(bytes, path);
  NEURON_CHECK(e->ParseFromArray(payload, static_cast<int>(size)),
               WhyNotParsed(payload, size, path));
  ValidateExecutable(*e, device);
}

}  // namespace

proto::Executable LoadExecutable(const std::string& path, const DeviceSpec& device) {
  proto::Executable e;
  ParseInto(ReadFile(path, "executable"), path, device, &e);
  return e;
}

std::shared_ptr<const proto::Executable> LoadExecutableShared(const std::string& path,
                                                              const DeviceSpec& device) {
  return ParseExecutableShared(ReadFile(path, "executable"), path, device);
}

std::shared_ptr<const proto::Executable> ParseExecutableShared(const std::string& bytes,
                                                               const std::string& path,
                                                               const DeviceSpec& device) {
  auto arena = std::make_shared<google::protobuf::Arena>();
  auto* e = google::protobuf::Arena::CreateMessage<proto::Executable>(arena.get());
  ParseInto(bytes, path, device, e);
  return std::shared_ptr<const proto::Executable>(arena, e);  // owns the arena
}

void SaveExecutable(const proto::Executable& executable, const std::string& path) {
  WriteFileAtomically(path, ExecutableFileBytes(executable));
}

std::string ExecutableFileBytes(const proto::Executable& executable) {
  // The header, then the payload serialized in place after it (one buffer).
  std::string bytes(sizeof(FileHeader), '\0');
  executable.AppendToString(&bytes);
  FileHeader h;
  std::memcpy(h.magic, kMagic, 4);
  h.version = kExecutableFileVersion;
  h.size = bytes.size() - sizeof(FileHeader);
  h.checksum = Checksum(bytes.data() + sizeof(FileHeader), h.size);
  std::memcpy(bytes.data(), &h, sizeof(h));
  return bytes;
}

}  // namespace neuron::runtime
