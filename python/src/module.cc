// torchneuron._C: the "neuron" process group and the project's errors, for
// Python. Thin: every behaviour lives in neuron::c10d and below.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "neuron/c10d/process_group_neuron.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;
using neuron::c10d::ProcessGroupNeuron;

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

// neuron errors become Python exceptions deriving from RuntimeError:
//   NeuronError > InvalidUsageError, CollectiveTimeoutError, PeerError.
void RegisterErrors(py::module_& m) {
  static py::exception<neuron::Error> error(m, "NeuronError", PyExc_RuntimeError);
  static py::exception<neuron::InvalidUsage> invalid(m, "InvalidUsageError", error.ptr());
  static py::exception<neuron::TimeoutError> timeout(m, "CollectiveTimeoutError",
                                                     error.ptr());
  static py::exception<neuron::IoError> peer(m, "PeerError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const neuron::InvalidUsage& e) {
      PyErr_SetString(invalid.ptr(), e.what());
    } catch (const neuron::TimeoutError& e) {
      PyErr_SetString(timeout.ptr(), e.what());
    } catch (const neuron::IoError& e) {
      PyErr_SetString(peer.ptr(), e.what());
    } catch (const neuron::RemoteError& e) {
      PyErr_SetString(peer.ptr(), e.what());
    } catch (const neuron::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchneuron's C++ core: the neuron process group and its errors.";
  py::module_::import("torch.distributed");  // registers c10d's Python types
  RegisterErrors(m);

  py::class_<ProcessGroupNeuron, ::c10d::ProcessGroup, NoGilHolder<ProcessGroupNeuron>>(
      m, "ProcessGroupNeuron",
      "A torch.distributed process group on the simulated Neuron fabric.")
      .def(
          py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout,
                      std::vector<std::int64_t> global_ranks, std::string group_name) {
            return NoGilHolder<ProcessGroupNeuron>(neuron::c10d::CreateProcessGroupNeuron(
                store, rank, size, timeout, std::move(global_ranks),
                std::move(group_name)));
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::arg("global_ranks") = std::vector<std::int64_t>{},
          py::arg("group_name") = std::string(), py::call_guard<py::gil_scoped_release>(),
          "Collective: every member creates it with the same store.")
      .def(
          "records",
          [](ProcessGroupNeuron& pg) {
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
          [](ProcessGroupNeuron& pg) {
            neuron::collectives::CommunicatorTotals totals;
            {
              py::gil_scoped_release release;
              totals = pg.Totals();
            }
            return ToDict(totals);
          },
          "Cumulative counters (dict) over the completed collectives.")
      .def("reset_stats", &ProcessGroupNeuron::ResetStats,
           py::call_guard<py::gil_scoped_release>(), "Clears the records and counters.")
      .def("write_chrome_trace", &ProcessGroupNeuron::WriteChromeTrace, py::arg("path"),
           py::call_guard<py::gil_scoped_release>(),
           "Writes the records as a Chrome trace (wall and simulated tracks).")
      .def_property_readonly("transport", &ProcessGroupNeuron::TransportName,
                             "'shm' or 'tcp'.")
      .def_property_readonly("group_name", &ProcessGroupNeuron::group_name);
}
