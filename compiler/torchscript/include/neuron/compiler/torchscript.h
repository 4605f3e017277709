// The C++ frontend: a TorchScript module (torch.jit.trace or torch.jit.script,
// then .save(path), in Python; or torch::jit::Module::save in C++) becomes
// the compiler's IR, the same IR torchneuron.compile makes from FX graphs.
// The module is loaded with libtorch, frozen (parameters become constants),
// inlined, and given the example inputs' shapes and dtypes; each op of its
// graph becomes IR nodes (aten::linear a transpose and an addmm, aten::matmul
// an mm or bmm, aten::softmax an _softmax, aten::layer_norm a
// native_layer_norm, ...); integer arithmetic on shapes (x.size(0) in a
// traced view) is evaluated here, so every shape is static.
//
// Usage:
//   proto::Graph g = GraphFromTorchScript("mlp.pt", {torch::randn({32, 64})});
//   auto compiled = CompiledGraph::Compile(PrintGraph(g));
//   compiled->Run(...)   // inputs named "input0", "input1", ...
//
// InvalidUsage names what cannot be translated: the op and its source line
// (the TorchScript node's), a training-mode dropout, a non-static shape.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

// Graph inputs are named input0, input1, ... in forward's argument order;
// the outputs are forward's result (a tensor, or a tuple of tensors).
proto::Graph GraphFromTorchScript(const std::string& path, const std::vector<at::Tensor>& examples,
                                  const std::string& name = "torchscript");

}  // namespace neuron::compiler
