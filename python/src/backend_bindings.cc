// torchneuron._C's process group: the "neuron" c10d Backend and the job's
// authenticated store. Thin: every behaviour lives in neuron::c10d.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "neuron/c10d/backend_neuron.h"
#include "neuron/c10d/job_store.h"

namespace py = pybind11;
using neuron::c10d::BackendNeuron;

namespace {

// The holder of Python's reference to a process group, as torch's own
// (c10d/init.cpp): it drops the reference with the GIL released, because
// destroying the group joins its progress threads, and one of them may be
// waiting for the GIL to free a tensor that has a Python object.
template <typename T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  NoGilHolder(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}  // NOLINT: implicit
  // pybind11 builds holders from raw pointers of new objects.
  explicit NoGilHolder(T* impl)
      : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  NoGilHolder(const NoGilHolder&) = default;
  NoGilHolder(NoGilHolder&&) = default;
  NoGilHolder& operator=(const NoGilHolder&) = default;
  NoGilHolder& operator=(NoGilHolder&&) = default;
  ~NoGilHolder() {
    if (!impl_) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      impl_.reset();
    } else {
      impl_.reset();
    }
  }
  T* get() const noexcept { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};

// c10d's Backend.Options that Python can copy (split_group deep-copies its
// parent's options; torch binds the base class without copying).
struct CopyableOptions : ::c10d::Backend::Options {
  explicit CopyableOptions(const ::c10d::Backend::Options& o) : Options(o) {}
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilHolder<T>, true);

namespace {

py::dict ToDict(const neuron::collectives::OpRecord& r) {
  py::dict d;
  d["op"] = r.op;
  d["sequence"] = r.sequence;
  d["bytes"] = r.bytes;
  d["wall_us"] = r.wall_us;
  d["modelled_us"] = r.modelled_us;
  d["fabric_algorithm"] = r.fabric_algorithm;
  d["arrival_us"] = r.arrival_us;
  d["start_us"] = r.start_us;
  d["end_us"] = r.end_us;
  d["algbw_gbps"] = r.algbw_gbps;
  d["busbw_gbps"] = r.busbw_gbps;
  d["registered"] = r.registered;
  return d;
}

py::dict ToDict(const neuron::collectives::CommunicatorTotals& t) {
  py::dict d;
  d["operations"] = t.operations;
  d["bytes"] = t.bytes;
  d["wall_us"] = t.wall_us;
  d["modelled_us"] = t.modelled_us;
  d["waited_us"] = t.waited_us;
  return d;
}

}  // namespace

void BindBackend(py::module_& m) {
  py::class_<BackendNeuron, ::c10d::Backend, NoGilHolder<BackendNeuron>>(
      m, "BackendNeuron",
      "The torch.distributed backend on the simulated Neuron fabric.")
      .def(
          py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout,
                      std::vector<std::int64_t> global_ranks, std::string group_name) {
            return NoGilHolder<BackendNeuron>(neuron::c10d::CreateBackendNeuron(
                store, rank, size, timeout, std::move(global_ranks), std::move(group_name)));
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::arg("global_ranks") = std::vector<std::int64_t>{},
          py::arg("group_name") = std::string(), py::call_guard<py::gil_scoped_release>(),
          "Collective: every member creates it with the same store.")
      .def(
          "records",
          [](BackendNeuron& pg) {
            std::vector<neuron::collectives::OpRecord> records;
            {
              py::gil_scoped_release release;
              records = pg.Records();
            }
            py::list out;
            for (const auto& r : records) out.append(ToDict(r));
            return out;
          },
          "Per-operation records (dicts) of the completed collectives.")
      .def(
          "totals",
          [](BackendNeuron& pg) {
            neuron::collectives::CommunicatorTotals totals;
            {
              py::gil_scoped_release release;
              totals = pg.Totals();
            }
            return ToDict(totals);
          },
          "Cumulative counters (dict) over the completed collectives.")
      .def("reset_stats", &BackendNeuron::ResetStats,
           py::call_guard<py::gil_scoped_release>(), "Clears the records and counters.")
      .def("write_chrome_trace", &BackendNeuron::WriteChromeTrace, py::arg("path"),
           py::call_guard<py::gil_scoped_release>(),
           "Writes the records as a Chrome trace (wall and simulated tracks).")
      .def_property_readonly("transport", &BackendNeuron::TransportName,
                             "'shm' or 'tcp'.")
      .def_property_readonly("group_name", &BackendNeuron::group_name)
      .def_property_readonly(
          "options",
          [](BackendNeuron& b) { return c10::make_intrusive<CopyableOptions>(*b.getBackendOptions()); },
          "The group's Backend.Options (timeout, name, global ranks): split_group copies "
          "them for the new group.")
      .def("_shutdown", &BackendNeuron::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Runs what is queued, then stops the progress threads.");

  py::class_<CopyableOptions, ::c10d::Backend::Options, c10::intrusive_ptr<CopyableOptions>>(
      m, "BackendNeuronOptions", "The neuron backend's Backend.Options (copyable).")
      .def("__copy__", [](const CopyableOptions& o) { return c10::make_intrusive<CopyableOptions>(o); })
      .def("__deepcopy__", [](const CopyableOptions& o, py::dict) {
        return c10::make_intrusive<CopyableOptions>(o);
      });

  py::class_<neuron::c10d::JobStore, ::c10d::Store, c10::intrusive_ptr<neuron::c10d::JobStore>>(
      m, "_JobStore", "The job's authenticated store (neuronrun's), as a torch Store.")
      .def_property_readonly("endpoint", &neuron::c10d::JobStore::endpoint);
  m.def(
      "_connect_job_store",
      [](std::chrono::milliseconds timeout) { return neuron::c10d::ConnectJobStore(timeout); },
      py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "The job's store under neuronrun (authenticated), else None.");
}
