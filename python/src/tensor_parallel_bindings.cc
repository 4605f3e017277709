// torchneuron._C's tensor and sequence parallel collectives (autograd
// functions of neuron::parallel).
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/tensor_parallel_ops.h"

namespace py = pybind11;
namespace np = neuron::parallel;

void BindTensorParallel(py::module_& m) {
  m.def("_copy_to_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::CopyToGroup(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_reduce_from_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::ReduceFromGroup(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_gather_from_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g,
                                 std::int64_t dim) { return np::GatherFromGroup(x, Owned(g), dim); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_scatter_to_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g,
                                std::int64_t dim) { return np::ScatterToGroup(x, Owned(g), dim); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_gather_sequence", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::GatherSequence(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_reduce_scatter_sequence", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::ReduceScatterSequence(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_vocab_parallel_cross_entropy",
        [](const at::Tensor& logits, const at::Tensor& target, ::c10d::ProcessGroup& g,
           std::int64_t vocab_size) {
          return np::VocabParallelCrossEntropy(logits, target, Owned(g), vocab_size);
        }, py::call_guard<py::gil_scoped_release>());
}
