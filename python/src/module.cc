// torchneuron._C: the "neuron" process group and the project's errors, for
// Python. Thin: every behaviour lives in neuron::c10d and below.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>

#include "neuron/c10d/backend_neuron.h"
#include "neuron/c10d/job_store.h"
#include "neuron/compiler/compiled_graph.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/compiler/native_ops.h"
#include "neuron/compiler/torch_tensors.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"
#include "device_bindings.h"
#include "parallel_bindings.h"

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
  BindParallel(m);
  BindDevice(m);

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

  using neuron::compiler::CompiledGraph;
  using neuron::compiler::FromHost;
  using neuron::compiler::ToHost;
  py::class_<CompiledGraph, std::shared_ptr<CompiledGraph>>(
      m, "_CompiledGraph", "A graph compiled for the simulated NeuronCore.")
      .def(
          "run",
          [](CompiledGraph& g, const std::vector<at::Tensor>& inputs) {
            std::vector<neuron::runtime::HostTensor> host;
            for (const auto& t : inputs) host.push_back(ToHost(t));
            std::vector<neuron::runtime::HostTensor> out;
            {
              py::gil_scoped_release release;
              out = g.Run(std::move(host));
            }
            std::vector<at::Tensor> result;
            for (const auto& h : out) result.push_back(FromHost(h));
            return result;
          },
          py::arg("inputs"),
          "Runs the graph: real results, and the modelled time in info().")
      .def("write_timeline", &CompiledGraph::WriteTimeline, py::arg("path"),
           "Writes the plan's modelled timeline as a Chrome trace (one track per engine).")
      .def("info", [](const CompiledGraph& g) {
        const auto i = g.info();
        py::dict d;
        d["name"] = i.name;
        d["graph_id"] = i.cache_key;
        d["nodes_before"] = i.nodes_before;
        d["nodes_after"] = i.nodes_after;
        d["sbuf_bytes"] = i.sbuf_bytes;
        d["sbuf_lower_bound"] = i.sbuf_lower_bound;
        d["psum_bytes"] = i.psum_bytes;
        d["psum_lower_bound"] = i.psum_lower_bound;
        d["hbm_bytes"] = i.hbm_bytes;
        py::dict passes;
        for (const auto& [name, us] : i.pass_us) passes[name.c_str()] = us;
        d["pass_us"] = passes;
        py::dict engines;
        for (int k = 0; k < neuron::runtime::kEngineCount; ++k) {
          engines[neuron::runtime::Name(static_cast<neuron::runtime::Engine>(k))] = i.engine_us[k];
        }
        d["engine_us"] = engines;
        d["fused_groups"] = i.fused_groups;
        d["fused_ops"] = i.fused_ops;
        d["modelled_us"] = i.modelled_us;
        d["mfu"] = i.mfu;
        d["runs"] = i.runs;
        return d;
      });
  m.def("_compile_graph", &CompiledGraph::Compile, py::arg("text"),
        py::arg("options") = "", py::call_guard<py::gil_scoped_release>(),
        "Compiles IR text (neuron::compiler's text form) through the compile cache.");
  m.def(
      "_native_ops",
      [] {
        std::vector<std::string> names;
        for (const auto& op : neuron::compiler::NativeOps()) names.push_back(op.name);
        return names;
      },
      "The IR ops the device runs (compiler/src/native_ops.cc).");
  m.def(
      "_fallback_allowed",
      [] {
        return neuron::runtime::ConfigRegistry::Get()
                   .Find(neuron::runtime::ConfigKey::kFallback)
                   .value_or("1") != "0";
      },
      "NEURON_FALLBACK, read through the configuration registry.");
  m.def(
      "_clock",
      [] {
        const auto clock = neuron::runtime::ProcessClock();
        py::dict d;
        d["compute_us"] = clock->compute().count();
        d["collective_us"] = clock->collective().count();
        return d;
      },
      "This rank's simulated clocks (microseconds).");
  m.def("_reset_clock", [] { neuron::runtime::ProcessClock()->Reset(); });
  m.def(
      "_start_trace",
      [] {
        neuron::runtime::ProcessClock()->set_trace(std::make_shared<neuron::runtime::OpTrace>());
      },
      "Records this rank's operation trace from now on (a new, empty one).");
  m.def(
      "_trace_mark",
      [](const std::string& name) {
        if (auto trace = neuron::runtime::ProcessClock()->trace()) trace->Mark(name);
      },
      py::arg("name"), "Marks a point of the program in the trace being recorded, if any.");
  m.def(
      "_save_trace",
      [](const std::string& path, int rank, int world_size, int tp, int pp, int dp) {
        const auto trace = neuron::runtime::ProcessClock()->trace();
        NEURON_CHECK(trace != nullptr, "save_trace: no trace is being recorded "
                     "(call torchneuron.fabric.start_trace() first)");
        neuron::runtime::proto::TraceLayout layout;
        layout.set_tp(tp);
        layout.set_pp(pp);
        layout.set_dp(dp);
        trace->Save(path, rank, world_size, layout);
      },
      py::arg("path"), py::arg("rank"), py::arg("world_size"), py::arg("tp"), py::arg("pp"),
      py::arg("dp"), "Writes the recorded trace (op_trace.proto) to `path`.");
  m.def(
      "_advance_compute",
      [](double us) {
        NEURON_CHECK(us >= 0, "advance_compute: a duration must be >= 0 us, got ", us);
        neuron::runtime::ProcessClock()->AdvanceCompute(neuron::runtime::SimDuration(us));
      },
      py::arg("us"), "Charges `us` of modelled device time to this rank's compute stream.");
  m.def(
      "_matmul_us",
      [](std::int64_t m, std::int64_t k, std::int64_t n, bool fp32) {
        static const neuron::runtime::CostModel model(
            neuron::runtime::DeviceSpec::FromEnvironment());
        return model.Matmul(m, k, n, fp32).time.count();
      },
      py::arg("m"), py::arg("k"), py::arg("n"), py::arg("fp32"),
      "The device model's time (us) of an [m,k] x [k,n] matmul on one NeuronCore.");
  m.def(
      "_forget_compiled_in_memory", [] { CompiledGraph::Cache().ForgetMemory(); },
      "Drops the compile cache's in-memory entries (the disk cache keeps them).");
  m.def("_cache_counters", [] {
    const auto c = CompiledGraph::Cache().counters();
    py::dict d;
    d["memory_hits"] = c.memory_hits;
    d["disk_hits"] = c.disk_hits;
    d["misses"] = c.misses;
    d["evictions"] = c.evictions;
    d["corrupt"] = c.corrupt;
    return d;
  });
}
