// torchneuron._C's part for torchneuron.predict: the eager device's cost
// description of an ATen operation, from shapes and dtypes alone, so that a
// step captured on fake tensors is described exactly as the "neuron" device
// describes the same operation when it runs it (neuron::aten::Describe).
#include "bindings.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include "neuron/aten/op_info.h"
#include "neuron/runtime/device/eager_cost.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;

namespace {

// [(shape, dtype), ...] -> meta tensors of those shapes and dtypes.
std::vector<at::Tensor> MetaTensors(const py::list& shapes, const char* what) {
  std::vector<at::Tensor> out;
  for (const auto& item : shapes) {
    const auto pair = item.cast<py::tuple>();
    NEURON_CHECK(pair.size() == 2 && THPDtype_Check(pair[1].ptr()), "_describe_op: each ",
                 what, " is a (shape, torch.dtype) pair");
    const auto shape = pair[0].cast<std::vector<std::int64_t>>();
    const auto dtype = reinterpret_cast<THPDtype*>(pair[1].ptr())->scalar_type;
    out.push_back(at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kMeta)));
  }
  return out;
}

// name "aten::mm", overload "" or "out": InvalidUsage for an unknown operator.
py::dict DescribeOp(const std::string& name, const std::string& overload,
                    const py::list& inputs, const py::list& outputs) {
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  NEURON_CHECK(handle.has_value(), "_describe_op: no operator ", name,
               overload.empty() ? "" : ".", overload);
  const auto& info = neuron::aten::InfoOf(*handle);
  const auto in = MetaTensors(inputs, "input");
  const auto out = MetaTensors(outputs, "output");
  const neuron::runtime::EagerOp op = neuron::aten::Describe(info, in, out);
  py::dict d;
  d["kind"] = neuron::runtime::Name(op.kind);
  d["batch"] = op.matmul.batch;
  d["m"] = op.matmul.m;
  d["k"] = op.matmul.k;
  d["n"] = op.matmul.n;
  d["fp32"] = op.fp32;
  d["elements"] = op.elements;
  d["inputs"] = op.inputs;
  d["bytes_in"] = op.bytes_in;
  d["bytes_out"] = op.bytes_out;
  return d;
}

}  // namespace

void BindPredict(py::module_& m) {
  m.def("_describe_op", &DescribeOp, py::arg("name"), py::arg("overload"),
        py::arg("inputs"), py::arg("outputs"),
        "The eager device's cost description of one ATen operation run on tensors of "
        "these (shape, dtype) pairs: kind, matmul batch/m/k/n, fp32, elements, inputs, "
        "bytes_in, bytes_out.");
}
