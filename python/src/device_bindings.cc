// torchneuron._C's device functions: what torch.neuron (torchneuron.device)
// calls. Thin: the behaviour lives in neuron::aten.
#include "bindings.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "neuron/aten/adaptive_eager.h"
#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/op_log.h"
#include "neuron/aten/registration.h"

namespace py = pybind11;
namespace na = neuron::aten;

namespace {

// torch.accelerator.memory_stats()'s flat names ("allocated_bytes.all.peak",
// "num_ooms", ...) for the same DeviceStats, plus the device's own
// num_cache_hits and capacity_bytes.
py::dict MemoryStats(c10::DeviceIndex index) {
  using c10::CachingAllocator::Stat;
  using c10::CachingAllocator::StatArray;
  na::CachingAllocator& allocator = na::CachingAllocator::Get();
  const auto stats = allocator.getDeviceStats(na::CheckIndex(index, "memory_stats"));
  const na::DeviceMemoryStats own = allocator.Stats(index);
  py::dict d;
  auto stat = [&d](const std::string& name, const Stat& s) {
    d[py::str(name + ".current")] = s.current;
    d[py::str(name + ".peak")] = s.peak;
    d[py::str(name + ".allocated")] = s.allocated;
    d[py::str(name + ".freed")] = s.freed;
  };
  auto array = [&stat](const std::string& name, const StatArray& a) {
    const char* pools[] = {"all", "small_pool", "large_pool"};
    for (std::size_t i = 0; i < a.size(); ++i) stat(name + "." + pools[i], a[i]);
  };
  array("allocation", stats.allocation);
  array("segment", stats.segment);
  array("active", stats.active);
  array("inactive_split", stats.inactive_split);
  array("allocated_bytes", stats.allocated_bytes);
  array("reserved_bytes", stats.reserved_bytes);
  array("active_bytes", stats.active_bytes);
  array("inactive_split_bytes", stats.inactive_split_bytes);
  array("requested_bytes", stats.requested_bytes);
  stat("oversize_allocations", stats.oversize_allocations);
  stat("oversize_segments", stats.oversize_segments);
  d["num_alloc_retries"] = stats.num_alloc_retries;
  d["num_ooms"] = stats.num_ooms;
  d["num_sync_all_streams"] = stats.num_sync_all_streams;
  d["num_device_alloc"] = stats.num_device_alloc;
  d["num_device_free"] = stats.num_device_free;
  d["max_split_size"] = stats.max_split_size;  // 0: blocks are never split
  d["num_cache_hits"] = own.cache_hits;
  d["capacity_bytes"] = own.capacity;
  return d;
}

// torch.cuda.memory_snapshot()'s segments: one per block (blocks are never
// split), each holding its one block; no stack frames are recorded.
py::list MemorySnapshot() {
  py::list out;
  for (const na::BlockInfo& b : na::CachingAllocator::Get().Blocks()) {
    const bool live = b.state == na::BlockState::kActiveAllocated;
    const bool active = live || b.state == na::BlockState::kActivePendingFree;
    py::dict block;
    block["address"] = b.address;
    block["size"] = b.size;
    block["requested_size"] = b.requested;
    block["state"] = na::BlockStateName(b.state);
    block["frames"] = py::list();
    py::dict seg;
    seg["device"] = static_cast<int>(b.device);
    seg["address"] = b.address;
    seg["total_size"] = b.size;
    seg["allocated_size"] = live ? b.size : 0;
    seg["active_size"] = active ? b.size : 0;
    seg["requested_size"] = b.requested;
    seg["stream"] = b.stream;
    seg["segment_type"] = b.size <= (1u << 20) ? "small" : "large";  // memory_stats' pools
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    seg["frames"] = py::list();
    py::list blocks;
    blocks.append(block);
    seg["blocks"] = blocks;
    out.append(seg);
  }
  return out;
}

// torch.cuda.memory._snapshot()'s "device_traces": per device, its recorded
// history as {action, addr, size, stream, time_us, frames} (frames empty;
// device_free on "oom").
py::list MemoryTraces() {
  py::list out;
  for (const auto& device : na::CachingAllocator::Get().Traces()) {
    py::list entries;
    for (const na::TraceEntry& e : device) {
      py::dict d;
      d["action"] = na::TraceActionName(e.action);
      d["addr"] = e.addr;
      d["size"] = e.size;
      d["stream"] = e.stream;
      d["time_us"] = e.time_us;
      d["frames"] = py::list();
      if (e.action == na::TraceAction::kOom) d["device_free"] = e.device_free;
      entries.append(d);
    }
    out.append(entries);
  }
  return out;
}

// (phase, {"allocated_bytes", "reserved_bytes", "active_bytes"}) peaks.
py::list MemoryPhasePeaks(int index) {
  py::list out;
  for (const na::PhasePeak& p :
       na::CachingAllocator::Get().PhasePeaks(static_cast<c10::DeviceIndex>(index))) {
    py::dict levels;
    levels["allocated_bytes"] = p.peak.allocated;
    levels["reserved_bytes"] = p.peak.reserved;
    levels["active_bytes"] = p.peak.active;
    out.append(py::make_tuple(p.phase, levels));
  }
  return out;
}

py::list EagerRecords() {
  na::adaptive::Flush("sync");  // adaptive eager's open region is recorded first
  py::list out;
  for (const auto& r : na::OpLog::Get().Records()) {
    py::dict d;
    d["op"] = r.op;
    d["start_us"] = r.start_us;
    d["modelled_us"] = r.modelled_us;
    d["wall_us"] = r.wall_us;
    d["bytes"] = r.bytes;
    d["kind"] = r.kind;
    d["allocated"] = r.allocated;
    out.append(d);
  }
  return out;
}

py::dict EagerTotals() {
  na::adaptive::Flush("sync");
  const na::EagerTotals t = na::OpLog::Get().Totals();
  py::dict d;
  d["operations"] = t.operations;
  d["modelled_us"] = t.modelled_us;
  d["wall_us"] = t.wall_us;
  d["bytes"] = t.bytes;
  return d;
}

}  // namespace

void BindDevice(py::module_& m) {
  m.def("_register_device", &na::RegisterNeuronDevice);
  m.def("_device_count", [] { return na::Inventory().count; });
  m.def("_device_name", [] { return na::Inventory().name; });
  m.def("_node_cores", [] { return na::Inventory().node_cores; });
  m.def("_current_device", [] { return static_cast<int>(na::CurrentDevice()); });
  m.def("_set_device", [](int index) { na::SetCurrentDevice(static_cast<c10::DeviceIndex>(index)); });
  m.def("_check_device", [](int index, const std::string& what) {
    return static_cast<int>(na::CheckIndex(static_cast<c10::DeviceIndex>(index), what.c_str()));
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        na::DefaultGenerator(na::CheckIndex(static_cast<c10::DeviceIndex>(index), "generator"))));
  });
  m.def("_memory_stats", [](int index) { return MemoryStats(static_cast<c10::DeviceIndex>(index)); });
  m.def("_reset_peak_memory_stats", [](int index) {
    na::CachingAllocator::Get().ResetPeaks(
        na::CheckIndex(static_cast<c10::DeviceIndex>(index), "reset_peak_memory_stats"));
  });
  m.def("_reset_accumulated_memory_stats", [](int index) {
    na::CachingAllocator::Get().resetAccumulatedStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_mem_get_info", [](int index) {
    return na::CachingAllocator::Get().getMemoryInfo(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_empty_cache", [] { na::CachingAllocator::Get().EmptyCache(); });
  m.def("_memory_snapshot", &MemorySnapshot);
  m.def("_set_memory_phase", [](int index, const std::string& phase) {
    return na::CachingAllocator::Get().SetPhase(static_cast<c10::DeviceIndex>(index), phase);
  });
  m.def("_memory_phase_peaks", &MemoryPhasePeaks);
  m.def("_record_memory_history", [](std::size_t max_entries) {
    na::CachingAllocator::Get().RecordHistory(max_entries);
  });
  m.def("_memory_traces", &MemoryTraces);
  m.def("_eager_records", &EagerRecords);
  m.def("_eager_totals", &EagerTotals);
  m.def("_eager_reset", [] { na::OpLog::Get().Reset(); });
}
