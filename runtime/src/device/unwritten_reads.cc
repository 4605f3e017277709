#include "unwritten_reads.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string_view>
#include <unordered_map>

#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/device/executor.h"

namespace neuron::runtime::detail {
namespace {

// Disjoint [begin, end) byte intervals of one memory space, begin -> end.
using Intervals = std::map<std::uint64_t, std::uint64_t>;

// Adds [begin, end), merging what it touches.
void Cover(Intervals& set, std::uint64_t begin, std::uint64_t end) {
  if (begin >= end) return;
  auto it = set.upper_bound(begin);
  if (it != set.begin() && std::prev(it)->second >= begin) --it;
  while (it != set.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set.emplace(begin, end);
}

// Adds to `gaps` the parts of [begin, end) that `set` does not cover.
void Gaps(const Intervals& set, std::uint64_t begin, std::uint64_t end, Intervals& gaps) {
  auto it = set.upper_bound(begin);
  if (it != set.begin() && std::prev(it)->second > begin) --it;
  for (; begin < end; ++it) {
    if (it == set.end() || it->first >= end) {
      Cover(gaps, begin, end);
      return;
    }
    if (it->first > begin) Cover(gaps, begin, it->first);
    begin = std::max(begin, it->second);
  }
}

}  // namespace

std::int64_t WrittenBytes(const proto::Instruction& i, const proto::Buffer& b) {
  const std::int64_t elements =
      i.elements() * static_cast<std::int64_t>(ElementBytes(b.dtype()));
  switch (i.op()) {
    case proto::OP_LOAD:
    case proto::OP_STORE:
    case proto::OP_SPILL:
    case proto::OP_RELOAD:
      return static_cast<std::int64_t>(i.bytes());
    case proto::OP_MATMUL:
      return i.accumulate() ? -1 : static_cast<std::int64_t>(b.bytes());
    case proto::OP_LAYER_NORM_ROWS:
    case proto::OP_LAYER_NORM_BACKWARD_ROWS:
      return static_cast<std::int64_t>(b.bytes());
    case proto::OP_STRIDED_COPY: {
      if (i.out_strides_size() > 0 || i.out_offset() != 0) return -1;
      std::int64_t n = static_cast<std::int64_t>(ElementBytes(b.dtype()));
      for (auto d : i.view_sizes()) n *= d;
      return n;
    }
    default:
      break;
  }
  const DeviceOp* op = FindDeviceOp(i.op());
  if (op == nullptr) return -1;
  const std::string_view kernel = op->kernel;
  if (kernel == "Fused" && i.fused_size() == 0) return -1;  // writes nothing
  if (kernel == "Elementwise" || kernel == "Fused" || kernel == "Shaped" ||
      kernel == "Scan")
    return elements;
  return -1;
}

bool StridedWrites(const proto::Instruction& i, const proto::Buffer& b,
                   const std::function<void(std::uint64_t, std::uint64_t)>& run) {
  constexpr std::int64_t kMaxRuns = 1 << 20;
  const int rank = i.view_sizes_size();
  if (i.op() != proto::OP_STRIDED_COPY || i.out_strides_size() != rank ||
      i.out_offset() < 0) {
    return false;
  }
  // Dims of more than one element, outermost first; then the innermost
  // ones that continue each other's elements merged into one run.
  std::vector<std::int64_t> sizes, strides;
  for (int d = 0; d < rank; ++d) {
    if (i.view_sizes(d) == 0) return true;  // writes nothing
    if (i.view_sizes(d) == 1) continue;
    if (i.out_strides(d) < 0) return false;
    sizes.push_back(i.view_sizes(d));
    strides.push_back(i.out_strides(d));
  }
  std::int64_t run_elements = 1;
  while (!sizes.empty() && strides.back() == run_elements) {
    run_elements *= sizes.back();
    sizes.pop_back(), strides.pop_back();
  }
  std::int64_t runs = 1;
  for (auto n : sizes) runs *= n;
  if (runs > kMaxRuns) return false;
  const auto element = static_cast<std::uint64_t>(ElementBytes(b.dtype()));
  std::vector<std::int64_t> index(sizes.size(), 0);
  for (std::int64_t r = 0; r < runs; ++r) {
    std::int64_t at = i.out_offset();
    for (std::size_t d = 0; d < sizes.size(); ++d) at += index[d] * strides[d];
    run(static_cast<std::uint64_t>(at) * element,
        static_cast<std::uint64_t>(at + run_elements) * element);
    for (std::size_t d = sizes.size(); d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
  return true;
}

std::vector<ByteRange> UnwrittenReads(const proto::Executable& e,
                                      const std::unordered_set<std::uint32_t>& direct,
                                      const Elisions& elided) {
  std::unordered_map<std::uint32_t, const proto::Buffer*> buffers;
  for (const auto& b : e.buffers()) buffers[b.id()] = &b;
  std::unordered_map<std::uint32_t, const MovedBuffer*> moved;
  for (const MovedBuffer& m : elided.moved) moved[m.buffer] = &m;
  // Intervals per arena (key: its space, >= 0) and per block (-1 - home).
  // A byte read twice before written is zeroed once: reads merge.
  std::map<std::int64_t, Intervals> written, reads;
  // Where b's bytes are for this run: a key of `written` and b's first
  // byte there; false when they are the caller's.
  std::function<bool(std::uint32_t, std::int64_t&, std::uint64_t&)> locate =
      [&](std::uint32_t id, std::int64_t& key, std::uint64_t& begin) {
        if (direct.count(id)) return false;
        auto m = moved.find(id);
        if (m == moved.end()) {
          key = buffers.at(id)->space(), begin = buffers.at(id)->offset();
          return true;
        }
        if (m->second->home == id) {  // an output's own block
          key = -1 - static_cast<std::int64_t>(id), begin = 0;
          return true;
        }
        if (!locate(m->second->home, key, begin)) return false;
        begin += m->second->offset;
        return true;
      };
  auto write = [&](const proto::Buffer& b, std::uint64_t bytes) {
    std::int64_t key;
    std::uint64_t begin;
    if (!locate(b.id(), key, begin)) return;
    Cover(written[key], begin, begin + std::min<std::uint64_t>(bytes, b.bytes()));
  };
  auto read = [&](const proto::Buffer& b) {
    std::int64_t key;
    std::uint64_t begin;
    if (!locate(b.id(), key, begin)) return;
    Gaps(written[key], begin, begin + b.bytes(), reads[key]);
  };
  for (const auto& c : e.constants()) write(*buffers.at(c.buffer()), c.data().size());
  for (const auto& binding : e.inputs()) {
    const proto::Buffer& b = *buffers.at(binding.buffer());
    write(b, b.bytes());
  }
  for (const auto& i : e.instructions()) {
    for (auto id : i.inputs()) read(*buffers.at(id));
    for (auto id : i.outputs()) {
      const proto::Buffer& b = *buffers.at(id);
      std::int64_t key;
      std::uint64_t begin;
      if (i.op() == proto::OP_STRIDED_COPY && locate(b.id(), key, begin) &&
          StridedWrites(i, b, [&](std::uint64_t from, std::uint64_t to) {
            Cover(written[key], begin + from, begin + std::min(to, b.bytes()));
          })) {
        continue;
      }
      const std::int64_t bytes = WrittenBytes(i, b);
      if (bytes < 0) read(b);
      write(b, bytes < 0 ? b.bytes() : static_cast<std::uint64_t>(bytes));
    }
  }
  for (const auto& binding : e.outputs()) read(*buffers.at(binding.buffer()));
  std::vector<ByteRange> out;
  for (const auto& [key, set] : reads) {
    for (const auto& [begin, end] : set) {
      if (key >= 0) out.push_back({static_cast<int>(key), begin, end});
      if (key < 0) out.push_back({0, begin, end, -1 - key});
    }
  }
  return out;
}

}  // namespace neuron::runtime::detail
