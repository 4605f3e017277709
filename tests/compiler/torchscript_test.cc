// The C++ frontend: TorchScript modules (built and saved here with libtorch,
// as Python's torch.jit.save would) become IR that compiles, runs on the
// executor and matches libtorch; what the device cannot run is refused
// naming the op and where it is.
#include "neuron/compiler/torch_tensors.h"
#include "neuron/compiler/torchscript.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cstdio>
#include <filesystem>

#include "neuron/compiler/compiled_graph.h"
#include "neuron/compiler/graph_text.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

std::string Save(torch::jit::Module& m, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name + ".pt";
  m.save(path);
  return path;
}

// Compiles `path` for `inputs`, runs it, and checks it against libtorch.
void ExpectCompiledMatchesLibtorch(const std::string& path, const std::vector<at::Tensor>& inputs) {
  const proto::Graph g = GraphFromTorchScript(path, inputs, "m");
  auto compiled = CompiledGraph::Compile(PrintGraph(g), "");
  std::vector<runtime::HostTensor> host;
  for (const auto& t : inputs) host.push_back(ToHost(t));
  const auto got = compiled->Run(host).at(0).ToFloats();
  torch::jit::Module module = torch::jit::load(path);
  module.eval();
  const at::Tensor want = module.forward({inputs.begin(), inputs.end()}).toTensor().contiguous();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(want.numel()));
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want.data_ptr<float>()[i], 1e-5) << i;
  }
  EXPECT_GT(compiled->info().modelled_us, 0);
}

torch::jit::Module Block() {
  torch::manual_seed(0);
  torch::jit::Module m("Block");
  m.register_parameter("w1", torch::randn({64, 32}) * 0.1, false);
  m.register_parameter("b1", torch::randn({64}) * 0.1, false);
  m.register_parameter("w2", torch::randn({32, 64}) * 0.1, false);
  m.register_parameter("g", torch::ones({32}), false);
  m.register_parameter("b", torch::zeros({32}), false);
  m.define(R"(
def forward(self, x):
    h = torch.tanh(torch.matmul(x, self.w1.t()) + self.b1)
    y = torch.matmul(h, self.w2.t()) + x
    y = torch.layer_norm(y, [32], self.g, self.b, 1e-5, False)
    q, k = y.chunk(2, dim=-1)
    a = torch.softmax(torch.matmul(q, k.transpose(1, 2)) / 4.0, dim=-1)
    return torch.relu(torch.matmul(a, k)).reshape(x.size(0), -1)
)");
  return m;
}

TEST(TorchScript, AScriptedBlockCompilesAndMatchesLibtorch) {
  torch::jit::Module m = Block();
  const std::string path = Save(m, "block");
  ExpectCompiledMatchesLibtorch(path, {torch::randn({2, 8, 32})});
  std::filesystem::remove(path);
}

TEST(TorchScript, WhatTheDeviceCannotRunIsRefusedNamingTheOp) {
  torch::jit::Module m("Cumprod");
  m.define(R"(
def forward(self, x):
    return torch.cumprod(torch.relu(x), dim=1)
)");
  const std::string path = Save(m, "cumprod");
  try {
    GraphFromTorchScript(path, {torch::randn({2, 3})});
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("TorchScript node aten::cumprod at "), std::string::npos) << what;
    EXPECT_NE(what.find("aten.cumprod is not supported on the device"), std::string::npos)
        << what;
  }
  try {
    GraphFromTorchScript(path, {});
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("forward takes 1 inputs, 0 examples were given"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(GraphFromTorchScript(path, {torch::randn({2, 3})}), IoError);
}

}  // namespace
}  // namespace neuron::compiler
