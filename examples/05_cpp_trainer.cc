// Example 05: a libtorch (C++) trainer on neuron::parallel, no Python.
//
//   neuronrun -n 8 build/examples/cpp_trainer --tp 2 --zero 3     # dp = 4
//   neuronrun -n 8 build/examples/cpp_trainer --tp 2 --pp 2       # dp = 2, 1F1B
//   neuronrun -n 2 build/examples/cpp_trainer                     # data parallel
//
// A small language model (vocab-parallel embedding, residual MLP blocks of
// column- and row-parallel linears, vocab-parallel LM head and
// cross-entropy) trained on synthetic tokens with tensor parallelism (--tp),
// pipeline stages (--pp: PipelineEngine, 1F1B over --microbatches; layers
// balanced by parameter count) and data parallelism over the rest:
// gradients averaged by the GradientReducer (DDP) or AverageGradients (with
// a pipeline), or with --zero 1/2/3 the model is one ZeRO unit
// (ShardedUnit). The groups come from InitializeParallel over a c10d
// TCPStore at MASTER_ADDR:MASTER_PORT (which neuronrun sets). Rank 0
// prints per step: loss, wall time and tokens/s, the modelled step time and
// tokens/s (device model for the matmuls, fabric model for collectives),
// and the largest resident memory of any rank.
#include <ATen/ATen.h>
#include <sys/resource.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "neuron/parallel/gradient_reducer.h"
#include "neuron/parallel/pipeline_engine.h"
#include "neuron/parallel/process_groups.h"
#include "neuron/parallel/sharded_unit.h"
#include "neuron/parallel/tensor_parallel_ops.h"
#include "neuron/parallel/token_data.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace np = neuron::parallel;

namespace {

struct Options {
  int tp = 1, pp = 1, zero = 0, microbatches = 4, steps = 5, batch = 8, seq = 32, dim = 64,
      layers = 2, vocab = 256;
  double lr = 0.05;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> int {
      NEURON_CHECK(i + 1 < argc, "cpp_trainer: ", a, " needs a value");
      return std::atoi(argv[++i]);
    };
    if (a == "--tp") o.tp = value();
    else if (a == "--pp") o.pp = value();
    else if (a == "--microbatches") o.microbatches = value();
    else if (a == "--zero") o.zero = value();
    else if (a == "--steps") o.steps = value();
    else if (a == "--batch") o.batch = value();
    else if (a == "--layers") o.layers = value();
    else if (a == "--dim") o.dim = value();
    else throw neuron::InvalidUsage("cpp_trainer: unknown option " + a +
                                    " (--tp N --pp N --zero 0-3 --microbatches N --steps N --batch N --layers N "
                                    "--dim N)");
  }
  return o;
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  NEURON_CHECK(v != nullptr, "$", name, " is not set: run cpp_trainer under neuronrun");
  return std::atoi(v);
}

// The model as layers (embedding, blocks, head), each with its parameters:
// full tensors made from one seed on every rank, then this rank's
// tensor-parallel slice.
struct Model {
  np::GroupPtr tp;
  int t = 1, r = 0;
  std::int64_t vocab, padded_vocab;
  std::vector<std::vector<at::Tensor>> layers;  // [embedding], [w1, b1, w2, b2]..., [head]

  Model(const Options& o, np::GroupPtr group) : tp(std::move(group)) {
    t = tp->getSize();
    r = tp->getRank();
    vocab = o.vocab;
    padded_vocab = (o.vocab + t - 1) / t * t;
    NEURON_CHECK(4 * o.dim % t == 0, "cpp_trainer: tensor parallel ", t,
                 " does not divide the MLP width ", 4 * o.dim);
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1234);
    auto full = [&](std::vector<std::int64_t> shape, double scale) {
      return at::randn(shape, g) * scale;
    };
    auto rows = [&](const at::Tensor& w, std::int64_t n) {  // padded to n rows, then sliced
      at::Tensor p = at::zeros({n, w.size(1)});
      p.narrow(0, 0, w.size(0)).copy_(w);
      return p.narrow(0, r * n / t, n / t).clone();
    };
    layers.push_back({rows(full({o.vocab, o.dim}, 1.0), padded_vocab)});
    for (int l = 0; l < o.layers; ++l) {
      const std::int64_t h = 4 * o.dim;
      layers.push_back(
          {full({h, o.dim}, 1 / std::sqrt(o.dim)).narrow(0, r * h / t, h / t).clone(),
           at::zeros({h / t}),
           full({o.dim, h}, 1 / std::sqrt(h)).narrow(1, r * h / t, h / t).clone(),
           at::zeros({o.dim})});
    }
    layers.push_back({rows(full({o.vocab, o.dim}, 1 / std::sqrt(o.dim)), padded_vocab)});
    for (auto& layer : layers) {
      for (auto& p : layer) p.requires_grad_(true);
    }
  }

  std::vector<at::Tensor> Params(int begin, int end) const {
    std::vector<at::Tensor> out;
    for (int i = begin; i < end; ++i) out.insert(out.end(), layers[i].begin(), layers[i].end());
    return out;
  }

  // Layer i: tokens -> activations -> ... -> logits (this rank's vocabulary part).
  at::Tensor Run(int i, const at::Tensor& x) const {
    const auto& w = layers[i];
    if (i == 0) {
      const std::int64_t part = padded_vocab / t, begin = r * part;
      at::Tensor local = x - begin;
      at::Tensor outside = (local < 0).logical_or(local >= part);
      at::Tensor e = at::embedding(w[0], local.masked_fill(outside, 0))
                         .masked_fill(outside.unsqueeze(-1), 0.0);
      return np::ReduceFromGroup(e, tp);
    }
    if (i + 1 == static_cast<int>(layers.size())) {
      return at::linear(np::CopyToGroup(x, tp), w[0]);
    }
    at::Tensor h = at::gelu(at::linear(np::CopyToGroup(x, tp), w[0], w[1]));
    return x + np::ReduceFromGroup(at::linear(h, w[2]), tp) + w[3];
  }

  at::Tensor Loss(const at::Tensor& logits, const at::Tensor& targets) const {
    return np::VocabParallelCrossEntropy(logits, targets, tp, vocab).mean();
  }

  // The device model's forward time of layers [begin, end) at this token count.
  double ForwardMicros(int begin, int end, std::int64_t tokens) const {
    static const neuron::runtime::CostModel cost(neuron::runtime::DeviceSpec::FromEnvironment());
    double us = 0;
    for (int i = std::max(begin, 1); i < end; ++i) {
      for (std::size_t k = 0; k < layers[i].size(); ++k) {
        if (layers[i][k].dim() != 2) continue;
        us += cost.Matmul(tokens, layers[i][k].size(1), layers[i][k].size(0), true).time.count();
      }
    }
    return us;
  }
};

double Slowest(::c10d::ProcessGroup& world, double value) {
  std::vector<at::Tensor> t{at::full({1}, value, at::kDouble)};
  ::c10d::AllreduceOptions o;
  o.reduceOp = ::c10d::ReduceOp::MAX;
  world.allreduce(t, o)->wait();
  return t[0].item<double>();
}

int Run(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  const int rank = EnvInt("RANK"), world = EnvInt("WORLD_SIZE");
  ::c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(EnvInt("MASTER_PORT"));
  so.isServer = rank == 0;
  so.numWorkers = world;
  auto store = c10::make_intrusive<::c10d::TCPStore>(std::getenv("MASTER_ADDR"), so);
  np::ParallelGroups groups = np::InitializeParallel(store, rank, world, {o.tp, o.pp, 0});
  const int dp = groups.layout.size(np::Axis::kData);
  const int dp_rank = groups.layout.Coordinates(rank).dp;
  NEURON_CHECK(o.pp == 1 || o.zero == 0, "cpp_trainer: --zero with --pp is not supported here "
               "(the Python example has it); data parallel averages the gradients instead");

  Model model(o, groups.tensor);
  // This stage's layers: a balanced split by parameter count.
  std::vector<double> costs;
  for (const auto& layer : model.layers) {
    double n = 0;
    for (const auto& p : layer) n += static_cast<double>(p.numel());
    costs.push_back(n);
  }
  const int stage = groups.layout.Coordinates(rank).pp;
  const std::vector<int> starts = np::BalancedPartition(costs, o.pp);
  const int begin = starts[stage], end = starts[stage + 1];
  const std::vector<at::Tensor> params = model.Params(begin, end);
  auto run_layers = [&](const at::Tensor& x) {
    at::Tensor y = x;
    for (int i = begin; i < end; ++i) y = model.Run(i, y);
    return y;
  };
  const std::int64_t micro_tokens = static_cast<std::int64_t>(o.batch) * o.seq / o.microbatches;
  const double layer_us = model.ForwardMicros(begin, end, micro_tokens);
  np::PipelineEngine engine(
      {1, o.microbatches, np::ScheduleKind::kOneForwardOneBackward, 0},
      [&](int, int, const at::Tensor& x) { return run_layers(x); },
      [&](const at::Tensor& logits, const at::Tensor& targets) {
        return model.Loss(logits, targets);
      },
      groups.pipeline, [&](int, const at::Tensor&) { return layer_us; });

  std::unique_ptr<np::GradientReducer> reducer;
  std::unique_ptr<np::ShardedUnit> unit;
  std::vector<at::Tensor> trained = params;
  if (o.zero > 0) {
    unit = std::make_unique<np::ShardedUnit>(params, groups.data,
                                             np::ShardingOptions{o.zero, at::kFloat, at::kFloat,
                                                                 "model"});
    trained = {unit->shard()};
  } else if (o.pp == 1) {
    reducer = std::make_unique<np::GradientReducer>(params, groups.data, np::ReducerOptions{});
  }
  const double step_compute_us =
      3 * model.ForwardMicros(0, static_cast<int>(model.layers.size()),
                              static_cast<std::int64_t>(o.batch) * o.seq);
  std::vector<at::Tensor> momentum;
  for (const auto& p : trained) momentum.push_back(at::zeros_like(p));

  const at::Tensor data = np::SyntheticTokens({o.batch * dp * o.steps, o.seq, o.vocab, 7});
  np::ShardedBatches batches(data, {0, dp, dp_rank, true, 7, false}, o.batch);
  const std::int64_t tokens_per_step = static_cast<std::int64_t>(o.batch) * dp * o.seq;
  if (rank == 0) {
    std::printf("cpp_trainer: %s, ZeRO %d, %lld tokens per step\n",
                groups.layout.Describe().c_str(), o.zero,
                static_cast<long long>(tokens_per_step));
  }
  auto clock = neuron::runtime::ProcessClock();
  for (int step = 0; step < o.steps && step < batches.size(); ++step) {
    groups.world->barrier()->wait();
    const double clock0 = clock->compute().count();
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor batch = batches.Get(0, step);
    const at::Tensor tokens = batch.narrow(1, 0, o.seq), targets = batch.narrow(1, 1, o.seq);
    at::Tensor loss;
    if (o.pp > 1) {  // the pipeline charges its own modelled compute
      loss = engine.Step(tokens, targets);
      np::AverageGradients(params, *groups.data);
      if (!loss.defined()) loss = at::zeros({});
    } else {
      if (unit) {
        unit->PrepareForBackward();
        unit->Gather();
      } else {
        reducer->PrepareForBackward();
      }
      loss = model.Loss(run_layers(tokens), targets);
      if (unit && o.zero == 3) {  // free after forward, gather again for backward
        unit->Free();
        loss.register_hook([&](const at::Tensor& g) {
          unit->Gather();
          return g;
        });
      }
      loss.backward();
      clock->AdvanceCompute(neuron::runtime::SimDuration(step_compute_us));
    }
    {
      at::NoGradGuard no_grad;  // SGD with momentum 0.9
      for (std::size_t i = 0; i < trained.size(); ++i) {
        momentum[i].mul_(0.9).add_(trained[i].grad());
        trained[i].sub_(momentum[i] * o.lr);
        trained[i].mutable_grad().reset();
      }
      if (unit) unit->MarkStale();
    }
    const double wall =
        Slowest(*groups.world, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             start).count());
    const double modelled = Slowest(*groups.world, clock->compute().count() - clock0);
    // The loss lives on the last stage: sum over data parallel and stages.
    std::vector<at::Tensor> l{loss.detach().reshape({1}).clone()};
    groups.data->allreduce(l)->wait();
    groups.pipeline->allreduce(l)->wait();
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    const double rss = Slowest(*groups.world, usage.ru_maxrss / 1024.0);
    if (rank == 0) {
      std::printf("step %d: loss %.4f | wall %.1f ms, %.0f tokens/s | modelled %.1f us, %.0f "
                  "tokens/s | max RSS %.0f MiB\n",
                  step, l[0].item<double>() / dp, wall * 1e3, tokens_per_step / wall, modelled,
                  tokens_per_step / modelled * 1e6, rss);
      std::fflush(stdout);
    }
  }
  groups.world->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpp_trainer: %s\n", e.what());
    return 1;
  }
}
