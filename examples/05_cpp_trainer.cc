// Example 05: a libtorch (C++) trainer on neuron::parallel, no Python.
//
//   neuronrun -n 8 build/examples/cpp_trainer --tp 2 --zero 3     # dp = 4
//   neuronrun -n 2 build/examples/cpp_trainer                     # data parallel
//
// A small language model (vocab-parallel embedding, residual MLP blocks of
// column- and row-parallel linears, vocab-parallel LM head and
// cross-entropy) trained on synthetic tokens with tensor parallelism (--tp)
// and data parallelism over the rest: gradients averaged by the
// GradientReducer (DDP), or with --zero 1/2/3 the model is one ZeRO unit
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
  int tp = 1, zero = 0, steps = 5, batch = 8, seq = 32, dim = 64, layers = 2, vocab = 256;
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
    else if (a == "--zero") o.zero = value();
    else if (a == "--steps") o.steps = value();
    else if (a == "--batch") o.batch = value();
    else if (a == "--layers") o.layers = value();
    else if (a == "--dim") o.dim = value();
    else throw neuron::InvalidUsage("cpp_trainer: unknown option " + a +
                                    " (--tp N --zero 0-3 --steps N --batch N --layers N --dim N)");
  }
  return o;
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  NEURON_CHECK(v != nullptr, "$", name, " is not set: run cpp_trainer under neuronrun");
  return std::atoi(v);
}

// The model's parameters: full tensors made from one seed on every rank,
// then this rank's tensor-parallel slice.
struct Model {
  np::GroupPtr tp;
  int t = 1, r = 0;
  std::int64_t vocab, padded_vocab;
  std::vector<at::Tensor> params;  // embedding, (w1, b1, w2, b2) per layer, head
  at::Tensor& embedding() { return params.front(); }
  at::Tensor& head() { return params.back(); }
  const at::Tensor& head() const { return params.back(); }

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
    params.push_back(rows(full({o.vocab, o.dim}, 1.0), padded_vocab));
    for (int l = 0; l < o.layers; ++l) {
      const std::int64_t h = 4 * o.dim;
      params.push_back(full({h, o.dim}, 1 / std::sqrt(o.dim)).narrow(0, r * h / t, h / t).clone());
      params.push_back(at::zeros({h / t}));
      params.push_back(full({o.dim, h}, 1 / std::sqrt(h)).narrow(1, r * h / t, h / t).clone());
      params.push_back(at::zeros({o.dim}));
    }
    params.push_back(rows(full({o.vocab, o.dim}, 1 / std::sqrt(o.dim)), padded_vocab));
    for (auto& p : params) p.requires_grad_(true);
  }

  // tokens, targets: int64 [batch, seq] -> mean cross-entropy.
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& targets) {
    const std::int64_t part = padded_vocab / t, begin = r * part;
    at::Tensor local = tokens - begin;
    at::Tensor outside = (local < 0).logical_or(local >= part);
    at::Tensor x = at::embedding(embedding(), local.masked_fill(outside, 0))
                       .masked_fill(outside.unsqueeze(-1), 0.0);
    x = np::ReduceFromGroup(x, tp);
    for (std::size_t i = 1; i + 1 < params.size(); i += 4) {
      at::Tensor h = at::gelu(at::linear(np::CopyToGroup(x, tp), params[i], params[i + 1]));
      x = x + np::ReduceFromGroup(at::linear(h, params[i + 2]), tp) + params[i + 3];
    }
    at::Tensor logits = at::linear(np::CopyToGroup(x, tp), head());
    return np::VocabParallelCrossEntropy(logits, targets, tp, vocab).mean();
  }

  // The device model's forward time: every matmul at this token count.
  double ForwardMicros(std::int64_t tokens) const {
    static const neuron::runtime::CostModel cost(neuron::runtime::DeviceSpec::FromEnvironment());
    double us = 0;
    for (std::size_t i = 1; i + 1 < params.size(); i += 4) {
      us += cost.Matmul(tokens, params[i].size(1), params[i].size(0), true).time.count();
      us += cost.Matmul(tokens, params[i + 2].size(1), params[i + 2].size(0), true).time.count();
    }
    return us + cost.Matmul(tokens, head().size(1), head().size(0), true).time.count();
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
  np::ParallelGroups groups = np::InitializeParallel(store, rank, world, {o.tp, 1, 0});
  const int dp = groups.layout.size(np::Axis::kData);
  const int dp_rank = groups.layout.Coordinates(rank).dp;

  Model model(o, groups.tensor);
  const double step_compute_us =
      3 * model.ForwardMicros(static_cast<std::int64_t>(o.batch) * o.seq);
  std::unique_ptr<np::GradientReducer> reducer;
  std::unique_ptr<np::ShardedUnit> unit;
  std::vector<at::Tensor> trained = model.params;
  if (o.zero > 0) {
    unit = std::make_unique<np::ShardedUnit>(model.params, groups.data,
                                             np::ShardingOptions{o.zero, at::kFloat, at::kFloat,
                                                                 "model"});
    trained = {unit->shard()};
  } else {
    reducer = std::make_unique<np::GradientReducer>(model.params, groups.data, np::ReducerOptions{});
  }
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
    if (unit) {
      unit->PrepareForBackward();
      unit->Gather();
      loss = model.Loss(tokens, targets);
      if (o.zero == 3) {  // free after forward, gather again for backward
        unit->Free();
        loss.register_hook([&](const at::Tensor& g) {
          unit->Gather();
          return g;
        });
      }
    } else {
      reducer->PrepareForBackward();
      loss = model.Loss(tokens, targets);
    }
    loss.backward();
    clock->AdvanceCompute(neuron::runtime::SimDuration(step_compute_us));
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
    std::vector<at::Tensor> l{loss.detach().reshape({1}).clone()};
    groups.data->allreduce(l)->wait();
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
