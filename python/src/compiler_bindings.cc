// torchneuron._C's compiler: graphs compiled for the simulated NeuronCore,
// the compile cache, the native operators and the dtypes. Thin: the
// behaviour lives in neuron::compiler.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "neuron/compiler/compiled_graph.h"
#include "neuron/compiler/native_ops.h"
#include "neuron/runtime/device/op_support.h"
#include "neuron/compiler/torch_tensors.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/device/sgemm.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/executable.pb.h"

namespace py = pybind11;

namespace {

py::dict InfoDict(const neuron::compiler::CompiledGraphInfo& i) {
  py::dict d;
  d["name"] = i.name;
  d["graph_id"] = i.cache_key;
  d["cache"] = i.cache_lookup;
  d["cache_report"] = i.cache_report;
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
}

void BindCompiledGraph(py::module_& m) {
  using neuron::compiler::CompiledGraph;
  using neuron::compiler::FromHost;
  using neuron::compiler::ViewOf;
  py::class_<CompiledGraph, std::shared_ptr<CompiledGraph>>(
      m, "_CompiledGraph", "A graph compiled for the simulated NeuronCore.")
      .def(
          "run",
          [](CompiledGraph& g, const std::vector<at::Tensor>& inputs,
             const std::vector<std::vector<std::int64_t>>& orders) {
            if (!orders.empty() && orders.size() != inputs.size()) {
              throw py::value_error("run: " + std::to_string(orders.size()) +
                                    " orders for " + std::to_string(inputs.size()) +
                                    " inputs");
            }
            // The inputs' own bytes (contiguous ones are not copied),
            // held for the run; as for an eager op, a tensor must not be
            // resized or have its storage set by another thread meanwhile.
            // An input with an order is read permuted to it: its bytes as
            // they lie when its strides are the ones it was traced with.
            std::vector<at::Tensor> held(inputs.size());
            std::vector<neuron::runtime::HostView> views;
            // Results go where the inputs live: "neuron" when any does.
            c10::Device device("cpu");
            for (std::size_t i = 0; i < inputs.size(); ++i) {
              const bool permuted = !orders.empty() && !orders[i].empty();
              views.push_back(
                  ViewOf(permuted ? inputs[i].permute(orders[i]) : inputs[i], &held[i]));
              if (inputs[i].device().is_privateuseone()) device = inputs[i].device();
            }
            std::vector<neuron::runtime::HostTensor> out;
            {
              py::gil_scoped_release release;
              out = g.Run(views);
            }
            std::vector<at::Tensor> result;
            for (auto& h : out) result.push_back(FromHost(std::move(h), device));
            return result;
          },
          py::arg("inputs"), py::arg("orders") = std::vector<std::vector<std::int64_t>>{},
          "Runs the graph: real results, and the modelled time in info(). `orders`, "
          "when given, has one list per input: empty, or the dims to permute it to "
          "before reading it (an input declared in its memory order).")
      .def(
          "write_timeline", &CompiledGraph::WriteTimeline, py::arg("path"),
          "Writes the plan's modelled timeline as a Chrome trace (one track per engine).")
      .def("plan_text", &CompiledGraph::PlanText,
           "The plan as protobuf text, constants' bytes replaced by their count.")
      .def(
          "info", [](const CompiledGraph& g) { return InfoDict(g.info()); },
          "The graph's compile figures and its modelled time (a dict).");
}

// The executor's sgemm: which one runs, and running it on tensors.
void BindSgemm(py::module_& m) {
  m.def(
      "_executor_sgemm", [] { return std::string(neuron::runtime::CurrentSgemm().name); },
      "The sgemm compiled graphs' matmuls run: \"aten\" (PyTorch's own BLAS's sgemm_), "
      "\"aten-dispatch\" (ATen's mm/bmm) or \"openblas\".");
  m.def(
      "_executor_sgemms", [] { return neuron::runtime::SgemmNames(); },
      "The sgemms this process can run, by name (_set_executor_sgemm takes one).");
  m.def(
      "_set_executor_sgemm",
      [](const std::string& name) {
        const neuron::runtime::Sgemm* s = neuron::runtime::FindSgemm(name);
        if (s == nullptr) {
          std::string known;
          for (const auto& n : neuron::runtime::SgemmNames())
            known += (known.empty() ? "" : ", ") + n;
          throw py::value_error("_set_executor_sgemm: no sgemm named '" + name +
                                "' in this process (it has " + known + ")");
        }
        neuron::runtime::SetSgemm(s);
      },
      py::arg("name"),
      "Makes the named sgemm (one of _executor_sgemms()) run compiled graphs' matmuls "
      "in this process.");
  m.def(
      "_run_sgemm",
      [](const at::Tensor& a, const at::Tensor& b, at::Tensor& c, bool accumulate,
         bool transpose_a, bool transpose_b) {
        // c [batch, m, n] (+)= a x b, a stored [batch, k, m] when transpose_a,
        // b [batch, n, k] when transpose_b; all contiguous float32 on the CPU.
        for (const at::Tensor* t : {&a, &b, static_cast<const at::Tensor*>(&c)}) {
          if (t->dim() != 3 || t->scalar_type() != at::kFloat || !t->is_contiguous() ||
              !t->device().is_cpu()) {
            throw py::value_error(
                "_run_sgemm takes contiguous [batch, rows, cols] float32 "
                "CPU tensors, got " +
                t->toString() + " of " + std::to_string(t->dim()) + " dims");
          }
        }
        const std::int64_t batch = c.size(0), m = c.size(1), n = c.size(2),
                           k = transpose_a ? a.size(1) : a.size(2);
        const bool fits =
            a.size(0) == batch && b.size(0) == batch &&
            a.size(transpose_a ? 2 : 1) == m && b.size(transpose_b ? 2 : 1) == k &&
            b.size(transpose_b ? 1 : 2) == n && batch > 0 && m > 0 && n > 0 && k > 0;
        if (!fits) throw py::value_error("_run_sgemm: the operands' shapes do not fit");
        py::gil_scoped_release release;
        neuron::runtime::CurrentSgemm().run(a.data_ptr<float>(), b.data_ptr<float>(),
                                            c.data_ptr<float>(), batch, m, k, n,
                                            accumulate, transpose_a, transpose_b);
      },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("accumulate"),
      py::arg("transpose_a"), py::arg("transpose_b"),
      "Runs the executor's sgemm (_executor_sgemm()) on float32 tensors: c (+)= a x b.");
}

// The native op table and the support table, as the Python frontend reads them.
void BindOpTables(py::module_& m) {
  m.def(
      "_native_ops",
      [] {
        std::vector<std::string> names;
        for (const auto& op : neuron::compiler::NativeOps()) names.push_back(op.name);
        return names;
      },
      "The IR ops the device runs (compiler/src/native_ops.cc).");
  m.def(
      "_native_ops_with",
      [](const std::string& trait) {
        std::vector<std::string> names;
        for (const auto& op : neuron::compiler::NativeOps()) {
          if (!trait.empty() && trait == neuron::compiler::Name(op.trait)) {
            names.push_back(op.name);
          }
        }
        if (names.empty()) {
          throw py::value_error("_native_ops_with: no op has trait '" + trait + "'");
        }
        return names;
      },
      py::arg("trait"),
      "The native IR ops of a trait (\"random\", \"same_bytes\", \"layout\"): those the "
      "frontend treats alike (compiler/include/neuron/compiler/native_ops.h, OpTrait).");
  m.def(
      "_unsupported_reason",
      [](const std::string& ir_op) -> std::string {
        const auto& row = neuron::runtime::SupportOf(neuron::compiler::SupportKey(ir_op));
        return row.support == neuron::runtime::Support::kUnsupported ? row.note : "";
      },
      py::arg("ir_op"),
      "Neuron's reason when the device's support table refuses IR op `ir_op` (e.g. "
      "aten.quantize_per_tensor), else \"\" (runtime/device/op_support.h).");
}

}  // namespace

void BindCompiler(py::module_& m) {
  using neuron::compiler::CompiledGraph;
  BindCompiledGraph(m);
  m.def("_compile_graph", &CompiledGraph::Compile, py::arg("text"),
        py::arg("options") = "", py::call_guard<py::gil_scoped_release>(),
        "Compiles IR text (neuron::compiler's text form) through the compile cache.");
  BindOpTables(m);
  m.def(
      "_compile_artifacts_dir",
      [] {
        const auto value = neuron::runtime::ConfigRegistry::Get().Find(
            neuron::runtime::ConfigKey::kCompileArtifacts);
        if (!value || *value == "0") return std::string();
        if (*value != "1") return *value;
        const std::string& cache = CompiledGraph::Cache().dir();
        if (cache.empty()) {
          throw neuron::InvalidUsage(
              "NEURON_COMPILE_ARTIFACTS=1 writes next to the compile cache, but the cache "
              "is memory only (NEURON_CACHE_DIR is set empty): give a directory instead");
        }
        return cache + "/artifacts";
      },
      "Where compiled graphs' artifacts go (NEURON_COMPILE_ARTIFACTS): \"\" for nowhere.");
  m.def(
      "_fallback_allowed",
      [] {
        return neuron::runtime::ConfigRegistry::Get()
                   .Find(neuron::runtime::ConfigKey::kFallback)
                   .value_or("1") != "0";
      },
      "NEURON_FALLBACK, read through the configuration registry.");
  BindSgemm(m);
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
  m.def(
      "_dtypes",
      [] {
        std::vector<std::tuple<std::string, std::string, bool>> out;
#define NEURON_BIND_DTYPE(Id, bytes, floating, name, ir, Torch, Device) \
  out.emplace_back(name, ir, neuron::runtime::proto::Device !=          \
                                 neuron::runtime::proto::ELEMENT_TYPE_UNSPECIFIED);
        NEURON_FORALL_DTYPES(NEURON_BIND_DTYPE)
#undef NEURON_BIND_DTYPE
        return out;
      },
      "Every dtype the project names (runtime/dtype_list.h): (torch name, IR name, "
      "whether the device computes in it).");
}
