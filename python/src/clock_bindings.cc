// torchneuron._C's simulated time: this rank's clocks, its operation trace
// the compiled graphs' runs and the device model's matmul time. Thin: the behaviour lives in
// neuron::runtime.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "bindings.h"
#include "neuron/aten/device_trace.h"
#include "neuron/compiler/graph_runs.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace py = pybind11;

namespace {

// The pipeline's structure in the trace being recorded (op_trace.proto's
// TracePipelineMark and TracePipeline), from torchneuron.parallel.pipeline.
void BindPipelineTrace(py::module_& m) {
  m.def(
      "_tracing", [] { return neuron::runtime::ProcessClock()->tracing(); },
      "Whether this rank's operation trace is being recorded.");
  m.def(
      "_trace_layer",
      [](int layer, bool forward, int microbatch, double input_bytes) {
        const auto trace = neuron::runtime::ProcessClock()->trace();
        if (!trace) return;
        trace->Mark(neuron::runtime::LayerMark(layer, forward, microbatch, input_bytes));
      },
      py::arg("layer"), py::arg("forward"), py::arg("microbatch"), py::arg("input_bytes"),
      "Marks where a pipeline chunk's layer begins, in the trace being recorded, if "
      "any.");
  m.def(
      "_trace_pipeline",
      [](const std::string& schedule, int microbatches, int chunks,
         const std::vector<double>& layer_costs,
         const std::vector<std::tuple<int, int, double>>& layers) {
        const auto trace = neuron::runtime::ProcessClock()->trace();
        if (!trace) return;
        neuron::runtime::proto::TracePipeline plan;
        plan.set_schedule(schedule);
        plan.set_microbatches(microbatches);
        plan.set_chunks(chunks);
        for (double c : layer_costs) plan.add_layer_costs(c);
        for (const auto& [chunk, index, bytes] : layers) {
          auto* layer = plan.add_layers();
          layer->set_chunk(chunk);
          layer->set_index(index);
          layer->set_gradient_bytes(bytes);
        }
        trace->SetPipeline(std::move(plan));
      },
      py::arg("schedule"), py::arg("microbatches"), py::arg("chunks"),
      py::arg("layer_costs"), py::arg("layers"),
      "Sets the pipeline stage's plan in the trace being recorded, if any.");
}

// "graph NAME", kept for the process's life (the device trace keeps names
// as pointers); one per graph name.
const char* GraphOpName(const std::string& graph) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert("graph " + graph).first->c_str();
}

// A compiled graph's run on torch.profiler's device lane, as an eager op of
// kind "compiled graph" whose device time is the run's modelled time.
void ToDeviceTrace(const neuron::compiler::GraphRun& run) {
  if (!neuron::aten::DeviceTrace::Recording()) return;
  neuron::aten::EagerRecord record;
  record.op = GraphOpName(run.name);
  record.start_us = run.start.count();
  record.modelled_us = run.modelled.count();
  record.wall_us = run.wall_us;
  record.kind = "compiled graph";
  neuron::aten::DeviceTrace::Add(record);
}

// The compiled graphs' runs (neuron::compiler::GraphRunLog) for profiles:
// ([run dicts], {plan id: [(engine, op, start_us, end_us), ...]}), each
// run naming its plan by id (plans are shared by the runs of a graph); a
// custom kernel (an nki kernel) has an entry on each engine it holds.
void BindGraphRuns(py::module_& m) {
  neuron::compiler::GraphRunLog::SetObserver(&ToDeviceTrace);
  m.def(
      "_graph_runs",
      [] {
        const auto runs = neuron::compiler::GraphRunLog::Get().Runs();
        py::list out;
        py::dict plans;
        std::map<const neuron::runtime::PlanTiming*, int> ids;
        for (const auto& r : runs) {
          const auto [it, added] = ids.emplace(r.timing.get(), static_cast<int>(ids.size()));
          if (added) {
            py::list schedule;
            for (const auto& i : r.timing->schedule) {
              schedule.append(py::make_tuple(neuron::runtime::Name(i.engine), i.op,
                                             i.start.count(), i.end.count()));
              for (const auto engine : i.also) {  // a custom kernel: on each of its engines
                schedule.append(py::make_tuple(neuron::runtime::Name(engine), i.op,
                                               i.start.count(), i.end.count()));
              }
            }
            plans[py::int_(it->second)] = schedule;
          }
          py::dict d;
          d["name"] = r.name;
          d["start_us"] = r.start.count();
          d["modelled_us"] = r.modelled.count();
          d["wall_us"] = r.wall_us;
          d["plan"] = it->second;
          out.append(d);
        }
        return py::make_tuple(out, plans);
      },
      "The latest compiled-graph runs of this process and their plans' engine timelines.");
  m.def(
      "_graph_runs_total", [] { return neuron::compiler::GraphRunLog::Get().total(); },
      "Compiled-graph runs since the last reset, however many the log still holds.");
  m.def(
      "_graph_runs_reset", [] { neuron::compiler::GraphRunLog::Get().Reset(); },
      "Clears the compiled-graph run log.");
}

}  // namespace

void BindClock(py::module_& m) {
  BindGraphRuns(m);
  m.def(
      "_clock",
      [] {
        neuron::runtime::SettlePendingCompute("sync");  // reading the clock observes it
        const auto clock = neuron::runtime::ProcessClock();
        py::dict d;
        d["compute_us"] = clock->compute().count();
        d["collective_us"] = clock->collective().count();
        d["charged_us"] = clock->charged().count();
        return d;
      },
      "This rank's simulated clocks (microseconds).");
  m.def("_reset_clock", [] { neuron::runtime::ProcessClock()->Reset(); });
  m.def(
      "_start_trace",
      [] {
        neuron::runtime::ProcessClock()->set_trace(
            std::make_shared<neuron::runtime::OpTrace>());
      },
      "Records this rank's operation trace from now on (a new, empty one).");
  m.def(
      "_trace_mark",
      [](const std::string& name) {
        if (auto trace = neuron::runtime::ProcessClock()->trace()) trace->Mark(name);
      },
      py::arg("name"),
      "Marks a point of the program in the trace being recorded, if any.");
  BindPipelineTrace(m);
  m.def(
      "_save_trace",
      [](const std::string& path, int rank, int world_size, int tp, int pp, int dp, int ep) {
        const auto trace = neuron::runtime::ProcessClock()->trace();
        NEURON_CHECK(trace != nullptr, "save_trace: no trace is being recorded "
                     "(call torchneuron.fabric.start_trace() first)");
        neuron::runtime::proto::TraceLayout layout;
        layout.set_tp(tp);
        layout.set_pp(pp);
        layout.set_dp(dp);
        if (ep > 1) layout.set_ep(ep);
        trace->Save(path, rank, world_size, layout);
      },
      py::arg("path"), py::arg("rank"), py::arg("world_size"), py::arg("tp"), py::arg("pp"),
      py::arg("dp"), py::arg("ep") = 1,
      "Writes the recorded trace (op_trace.proto) to `path`; an expert-parallel job's `tp` "
      "counts the ep x tp ranks of a replica (op_trace.proto's TraceLayout).");
  m.def(
      "_advance_compute",
      [](double us) {
        NEURON_CHECK(us >= 0, "advance_compute: a duration must be >= 0 us, got ", us);
        neuron::runtime::SettlePendingCompute("other");  // charged after the queued work
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
}
