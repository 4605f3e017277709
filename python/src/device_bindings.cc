// torchneuron._C's device functions: what torch.neuron (torchneuron.device)
// calls. Thin: the behaviour lives in neuron::aten.
#include "bindings.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/op_log.h"
#include "neuron/aten/registration.h"

namespace py = pybind11;
namespace na = neuron::aten;

namespace {

py::dict MemoryStats(c10::DeviceIndex index) {
  const na::DeviceMemoryStats s =
      na::CachingAllocator::Get().Stats(na::CheckIndex(index, "memory_stats"));
  py::dict d;
  d["allocated_bytes.all.current"] = s.allocated;
  d["allocated_bytes.all.peak"] = s.peak_allocated;
  d["reserved_bytes.all.current"] = s.reserved;
  d["reserved_bytes.all.peak"] = s.peak_reserved;
  d["active_bytes.all.current"] = s.allocated;
  d["active_bytes.all.peak"] = s.peak_allocated;
  d["allocation.all.allocated"] = s.allocations;
  d["allocation.all.freed"] = s.frees;
  d["num_cache_hits"] = s.cache_hits;
  d["num_ooms"] = s.ooms;
  d["capacity_bytes"] = s.capacity;
  return d;
}

py::list EagerRecords() {
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
  m.def("_empty_cache", [] { na::CachingAllocator::Get().EmptyCache(); });
  m.def("_eager_records", &EagerRecords);
  m.def("_eager_totals", &EagerTotals);
  m.def("_eager_reset", [] { na::OpLog::Get().Reset(); });
}
