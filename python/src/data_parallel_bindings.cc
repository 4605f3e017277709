// torchneuron._C's data parallelism: DDP's gradient reducer, ZeRO's sharded
// units and the helpers around them. Process groups arrive as torch's own
// Python objects (any backend).
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/gradient_reducer.h"
#include "neuron/parallel/sharded_unit.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;
namespace np = neuron::parallel;

namespace {

// torch dtypes arrive by name (str(torch.bfloat16) without "torch.").
at::ScalarType ParseFloatType(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw neuron::InvalidUsage("sharding: a compute or reduce dtype must be float32, bfloat16 or "
                             "float16, got '" + name + "'");
}

void BindGradientReducer(py::module_& m) {
  py::class_<np::GradientReducer>(m, "_GradientReducer")
      .def(py::init([](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group,
                       std::int64_t bucket_cap_bytes, std::int64_t first_bucket_bytes,
                       bool find_unused, bool bucket_view, std::vector<std::string> names) {
             np::ReducerOptions o;
             o.bucket_cap_bytes = bucket_cap_bytes;
             o.first_bucket_bytes = first_bucket_bytes;
             o.find_unused_parameters = find_unused;
             o.gradient_as_bucket_view = bucket_view;
             o.names = std::move(names);
             return std::make_unique<np::GradientReducer>(std::move(params), Owned(group), o);
           }),
           py::arg("params"), py::arg("group"), py::arg("bucket_cap_bytes"),
           py::arg("first_bucket_bytes"), py::arg("find_unused_parameters"),
           py::arg("gradient_as_bucket_view"), py::arg("names"))
      .def("prepare_for_backward", &np::GradientReducer::PrepareForBackward)
      .def("buckets",
           [](const np::GradientReducer& r) {
             std::vector<std::vector<std::size_t>> out;
             for (const auto& b : r.buckets()) out.push_back(b.parameters);
             return out;
           })
      .def("allreduces", &np::GradientReducer::allreduces);
}

void BindShardedUnit(py::module_& m) {
  using np::ShardedUnit;
  py::class_<ShardedUnit>(m, "_ShardedUnit")
      .def(py::init([](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group, int stage,
                       const std::string& param_dtype, const std::string& reduce_dtype,
                       std::string name, bool offload, std::vector<bool> sequence_parallel,
                       ::c10d::ProcessGroup* sequence_parallel_group) {
             np::ShardingOptions o{stage, ParseFloatType(param_dtype),
                                   ParseFloatType(reduce_dtype), std::move(name), offload};
             if (sequence_parallel_group != nullptr) {
               o.sequence_parallel = std::move(sequence_parallel);
               o.sequence_parallel_group = Owned(*sequence_parallel_group);
             }
             return std::make_unique<ShardedUnit>(std::move(params), Owned(group), std::move(o));
           }),
           py::arg("params"), py::arg("group"), py::arg("stage"), py::arg("param_dtype"),
           py::arg("reduce_dtype"), py::arg("name"), py::arg("offload") = false,
           py::arg("sequence_parallel") = std::vector<bool>{},
           py::arg("sequence_parallel_group") = nullptr,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("shard_numel",
                             [](const ShardedUnit& u) { return u.shard().numel(); })
      .def_property_readonly("shard", &ShardedUnit::shard)
      .def_property_readonly("numel", &ShardedUnit::numel)
      .def_property_readonly("padded_numel", &ShardedUnit::padded_numel)
      .def_property_readonly("stage", &ShardedUnit::stage)
      .def_property_readonly("gathered", &ShardedUnit::gathered)
      .def_property_readonly("gathering", &ShardedUnit::gathering)
      .def("start_gather", &ShardedUnit::StartGather, py::call_guard<py::gil_scoped_release>())
      .def("gather", &ShardedUnit::Gather, py::call_guard<py::gil_scoped_release>())
      .def("free", &ShardedUnit::Free, py::call_guard<py::gil_scoped_release>())
      .def("mark_stale", &ShardedUnit::MarkStale, py::call_guard<py::gil_scoped_release>())
      .def("prepare_for_backward", &ShardedUnit::PrepareForBackward)
      .def("full_parameters", &ShardedUnit::FullParameters,
           py::call_guard<py::gil_scoped_release>())
      .def("load_full_parameters", &ShardedUnit::LoadFullParameters,
           py::call_guard<py::gil_scoped_release>())
      .def("unshard", &ShardedUnit::Unshard, py::call_guard<py::gil_scoped_release>())
      .def("shard_of", &ShardedUnit::Shard)
      .def("set_require_gradient_sync", &ShardedUnit::SetRequireGradientSync)
      .def("discard_accumulated_gradients", &ShardedUnit::DiscardAccumulatedGradients)
      .def("local_grad_squared_norm", &ShardedUnit::LocalGradSquaredNorm, py::arg("counted"));
}

}  // namespace

void BindDataParallel(py::module_& m) {
  BindGradientReducer(m);
  BindShardedUnit(m);
  m.def(
      "_set_grad",
      [](at::Tensor& param, const at::Tensor& grad) { param.mutable_grad() = grad; },
      py::arg("param"), py::arg("grad"),
      "Sets param.grad without torch's same-dtype check (a master shard's "
      "reduce_dtype gradient).");
  m.def(
      "_average_gradients",
      [](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group, std::int64_t bucket_bytes) {
        np::AverageGradients(params, group, bucket_bytes);
      },
      py::arg("params"), py::arg("group"), py::arg("bucket_bytes"),
      py::call_guard<py::gil_scoped_release>());
  m.def("_model_state_memory", [] {
    const np::ModelStateMemory m = np::ShardedModelStateMemory();
    return std::make_pair(m.current, m.peak);
  });
  m.def("_set_optimizer_state_bytes", &np::SetOptimizerStateBytes);
  m.def("_reset_model_state_peak", &np::ResetModelStatePeak);
  m.def(
      "_broadcast_coalesced",
      [](std::vector<at::Tensor> tensors, ::c10d::ProcessGroup& group, int root,
         std::int64_t bucket_bytes) {
        np::BroadcastCoalesced(std::move(tensors), group, root, bucket_bytes);
      },
      py::arg("tensors"), py::arg("group"), py::arg("root"), py::arg("bucket_bytes"),
      py::call_guard<py::gil_scoped_release>());
}
