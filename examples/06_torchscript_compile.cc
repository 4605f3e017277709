// Example 06: a TorchScript module compiled for the simulated NeuronCore
// from C++ (libtorch), no Python at run time.
//
//   .venv/bin/python -c "import torch; torch.jit.trace(torch.nn.Sequential(
//       torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
//       torch.nn.Linear(256, 10)).eval(), torch.randn(32, 64)).save('mlp.pt')"
//   build/examples/torchscript_compile mlp.pt 32x64
//
// Loads the module, translates its forward to the compiler's IR
// (neuron::compiler::GraphFromTorchScript), compiles it (passes, lowering,
// the compile cache) and runs it on the executor with random inputs of the
// given shapes (one SHAPE per input, dims joined by "x"); runs the module
// itself in libtorch on the same inputs and prints the largest difference,
// the modelled time on a NeuronCore-v3 and the compile cache key. Exit
// status 1 when the results differ by more than 1e-4, 2 on bad arguments.
#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "neuron/compiler/compiled_graph.h"
#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/torch_tensors.h"
#include "neuron/compiler/torchscript.h"

namespace {

std::vector<std::int64_t> ParseShape(const std::string& text) {
  std::vector<std::int64_t> shape;
  std::stringstream in(text);
  std::string dim;
  while (std::getline(in, dim, 'x')) shape.push_back(std::stoll(dim));
  return shape;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: torchscript_compile MODULE.pt SHAPE [SHAPE...]  (e.g. 32x64)\n");
    return 2;
  }
  try {
    torch::manual_seed(0);
    std::vector<at::Tensor> inputs;
    for (int i = 2; i < argc; ++i) inputs.push_back(torch::randn(ParseShape(argv[i])));
    const auto graph = neuron::compiler::GraphFromTorchScript(argv[1], inputs, "module");
    auto compiled = neuron::compiler::CompiledGraph::Compile(neuron::compiler::PrintGraph(graph), "");
    std::vector<neuron::runtime::HostTensor> host;
    for (const auto& t : inputs) host.push_back(neuron::compiler::ToHost(t));
    const auto outputs = compiled->Run(host);
    torch::jit::Module module = torch::jit::load(argv[1]);
    module.eval();
    std::vector<torch::jit::IValue> args(inputs.begin(), inputs.end());
    const at::Tensor expected = module.forward(args).toTensor();
    const at::Tensor got = neuron::compiler::FromHost(outputs.at(0));
    const bool same_shape = got.sizes() == expected.sizes();
    const double worst = same_shape ? (got - expected).abs().max().item<double>() : INFINITY;
    const auto info = compiled->info();
    std::printf("%s: %d IR nodes (%d after the passes), %lld outputs of %s\n", argv[1],
                info.nodes_before, info.nodes_after, static_cast<long long>(got.numel()),
                same_shape ? "the module's size" : "ANOTHER size");
    std::printf("largest difference from libtorch: %.3g\n", worst);
    std::printf("modelled on a NeuronCore-v3: %.2f us; compile cache key %s\n",
                info.modelled_us, info.cache_key.substr(0, 16).c_str());
    return same_shape && worst <= 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchscript_compile: error: %s\n", e.what());
    return 2;
  }
}
