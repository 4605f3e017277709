// torchneuron._C's pipeline parallelism: schedules, the engine and the
// stage-to-stage sends.
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/pipeline_engine.h"
#include "neuron/parallel/pipeline_p2p.h"
#include "neuron/parallel/pipeline_schedule.h"

namespace py = pybind11;
namespace np = neuron::parallel;

namespace {

// Sends in flight (their works), waited for before the tensors may change.
struct PendingSends {
  std::vector<c10::intrusive_ptr<::c10d::Work>> works;
  void Wait() {
    for (auto& w : works) w->wait();
    works.clear();
  }
};

}  // namespace

void BindPipeline(py::module_& m) {
  m.def(
      "_make_schedule",
      [](const std::string& kind, int stages, int microbatches, int chunks) {
        const np::PipelinePlan plan =
            np::MakeSchedule(np::ParseScheduleKind(kind), stages, microbatches, chunks);
        std::vector<std::vector<std::tuple<bool, int, int>>> order;
        for (const auto& stage : plan.order) {
          order.emplace_back();
          for (const auto& t : stage) order.back().emplace_back(t.forward, t.microbatch, t.chunk);
        }
        py::dict d;
        d["order"] = order;
        d["makespan"] = plan.makespan;
        d["ideal"] = plan.ideal;
        d["bubble"] = plan.bubble();
        d["max_in_flight"] = plan.max_in_flight;
        return d;
      },
      py::arg("kind"), py::arg("stages"), py::arg("microbatches"), py::arg("chunks"));
  py::class_<np::PipelineEngine>(m, "_PipelineEngine")
      .def(py::init([](int chunks, int microbatches, const std::string& schedule,
                       std::int64_t batch_dim, np::PipelineEngine::Chunk chunk,
                       np::PipelineEngine::Loss loss, ::c10d::ProcessGroup& group,
                       std::optional<np::PipelineEngine::Cost> cost) {
             return std::make_unique<np::PipelineEngine>(
                 np::PipelineOptions{chunks, microbatches, np::ParseScheduleKind(schedule),
                                     batch_dim},
                 std::move(chunk), std::move(loss), Owned(group),
                 cost ? std::move(*cost) : np::PipelineEngine::Cost());
           }),
           py::arg("chunks"), py::arg("microbatches"), py::arg("schedule"), py::arg("batch_dim"),
           py::arg("chunk"), py::arg("loss"), py::arg("group"), py::arg("cost"))
      .def(
          "step",
          [](np::PipelineEngine& e, std::optional<at::Tensor> inputs,
             std::optional<at::Tensor> targets) -> std::optional<at::Tensor> {
            at::Tensor loss =
                e.Step(inputs.value_or(at::Tensor()), targets.value_or(at::Tensor()));
            if (!loss.defined()) return std::nullopt;
            return loss;
          },
          py::arg("inputs"), py::arg("targets"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("is_first", &np::PipelineEngine::first)
      .def_property_readonly("is_last", &np::PipelineEngine::last)
      .def("stats", [](const np::PipelineEngine& e) {
        const auto& s = e.stats();
        py::dict d;
        d["modelled_step_us"] = s.modelled_step_us;
        d["compute_us"] = s.compute_us;
        d["bubble"] = s.bubble;
        d["schedule_bubble"] = s.schedule_bubble;
        d["formula_bubble"] = s.formula_bubble;
        return d;
      });
  m.def("_balanced_partition", &np::BalancedPartition, py::arg("costs"), py::arg("parts"));
  py::class_<PendingSends>(m, "_PendingSends")
      .def(py::init<>())
      .def("wait", &PendingSends::Wait, py::call_guard<py::gil_scoped_release>())
      .def("__len__", [](const PendingSends& p) { return p.works.size(); });
  m.def(
      "_send_stage_tensor",
      [](PendingSends& pending, const at::Tensor& t, ::c10d::ProcessGroup& g, int dst,
         bool gradient, int microbatch, int virtual_stage) {
        auto works = np::SendStageTensor(g, dst, t, {gradient, microbatch, virtual_stage});
        pending.works.insert(pending.works.end(), works.begin(), works.end());
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_recv_stage_tensor",
      [](::c10d::ProcessGroup& g, int src, bool gradient, int microbatch, int virtual_stage,
         std::optional<at::Tensor> like) {
        return np::RecvStageTensor(g, src, {gradient, microbatch, virtual_stage}, like);
      },
      py::arg("group"), py::arg("src"), py::arg("gradient"), py::arg("microbatch"),
      py::arg("virtual_stage"), py::arg("like") = py::none(),
      py::call_guard<py::gil_scoped_release>());
}
