// Example 05: a libtorch (C++) trainer on neuron::parallel, no Python.
//
//   neuronrun -n 16 build/examples/cpp_trainer --tp 2 --pp 2 --zero 3  # dp = 4
//   neuronrun -n 8 build/examples/cpp_trainer --tp 2 --zero 3          # dp = 4
//   neuronrun -n 2 build/examples/cpp_trainer                          # data parallel
//
// A small GPT (vocab-parallel embedding with learned positions; blocks of
// layer norm, causal self-attention with its heads split over the
// tensor-parallel group and an MLP of column- and row-parallel linears;
// final layer norm, vocab-parallel LM head and cross-entropy) trained on
// synthetic tokens with tensor parallelism (--tp), pipeline stages (--pp:
// PipelineEngine, 1F1B over --microbatches; layers balanced by parameter
// count) and data parallelism over the rest (--dp, if given, must agree):
// gradients averaged by the GradientReducer (DDP) or AverageGradients (with
// a pipeline), or with --zero 1/2/3 each stage's layers are one ZeRO unit
// (ShardedUnit; stage 3 frees the parameters after each forward and gathers
// them again when backward reaches the stage). The groups come from
// InitializeParallel over a c10d TCPStore at MASTER_ADDR:MASTER_PORT (which
// neuronrun sets). Rank 0 prints per step: loss, wall time and tokens/s,
// the modelled step time and tokens/s (device model for the matmuls, fabric
// model for collectives), and the largest resident memory of any rank; at
// the end every rank's memory (RSS and ZeRO model-state peak). Not here:
// compiled graphs (the Python example's --compile).
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
  int dp = 0, tp = 1, pp = 1, zero = 0, microbatches = 4, steps = 5, batch = 8, seq = 32,
      dim = 64, heads = 4, layers = 2, vocab = 256;
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
    if (a == "--dp") o.dp = value();
    else if (a == "--tp") o.tp = value();
    else if (a == "--pp") o.pp = value();
    else if (a == "--microbatches") o.microbatches = value();
    else if (a == "--zero") o.zero = value();
    else if (a == "--steps") o.steps = value();
    else if (a == "--batch") o.batch = value();
    else if (a == "--layers") o.layers = value();
    else if (a == "--dim") o.dim = value();
    else if (a == "--heads") o.heads = value();
    else throw neuron::InvalidUsage("cpp_trainer: unknown option " + a +
                                    " (--dp N --tp N --pp N --zero 0-3 --microbatches N --steps N "
                                    "--batch N --layers N --dim N --heads N)");
  }
  return o;
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  NEURON_CHECK(v != nullptr, "$", name, " is not set: run cpp_trainer under neuronrun");
  return std::atoi(v);
}

// The model as layers (embedding, blocks, head), each with its parameters:
// full tensors made from one seed on every rank (the same draws whatever
// the layout), then this rank's tensor-parallel slice.
struct Model {
  np::GroupPtr tp;
  int t = 1, r = 0, heads = 1;  // heads: this rank's
  std::int64_t vocab, padded_vocab, dim, seq;
  // [token embedding, positions], per block [ln1 w, b, q w, b, k w, b, v w, b,
  // out w, b, ln2 w, b, fc1 w, b, fc2 w, b], [ln w, b, head w]
  std::vector<std::vector<at::Tensor>> layers;

  Model(const Options& o, np::GroupPtr group) : tp(std::move(group)) {
    t = tp->getSize();
    r = tp->getRank();
    vocab = o.vocab;
    dim = o.dim;
    seq = o.seq;
    padded_vocab = (o.vocab + t - 1) / t * t;
    NEURON_CHECK(o.heads % t == 0, "cpp_trainer: tensor parallel ", t,
                 " does not divide the ", o.heads, " attention heads");
    NEURON_CHECK(o.dim % o.heads == 0, "cpp_trainer: ", o.heads,
                 " heads do not divide the hidden size ", o.dim);
    heads = o.heads / t;
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1234);
    auto full = [&](std::vector<std::int64_t> shape, double scale) {
      return at::randn(shape, g) * scale;
    };
    auto rows = [&](const at::Tensor& w, std::int64_t n) {  // padded to n rows, then sliced
      at::Tensor p = at::zeros({n, w.size(1)});
      p.narrow(0, 0, w.size(0)).copy_(w);
      return p.narrow(0, r * n / t, n / t).clone();
    };
    auto column = [&](std::int64_t out, std::int64_t in) {  // output rows split
      return full({out, in}, 1 / std::sqrt(in)).narrow(0, r * out / t, out / t).clone();
    };
    auto row = [&](std::int64_t out, std::int64_t in) {  // input columns split
      return full({out, in}, 1 / std::sqrt(in)).narrow(1, r * in / t, in / t).clone();
    };
    const std::int64_t d = o.dim, h = 4 * o.dim;
    layers.push_back({rows(full({o.vocab, d}, 1.0), padded_vocab), full({o.seq, d}, 0.02)});
    for (int l = 0; l < o.layers; ++l) {
      layers.push_back({at::ones({d}), at::zeros({d}),                      // ln1
                        column(d, d), at::zeros({d / t}),                   // q (heads split)
                        column(d, d), at::zeros({d / t}),                   // k
                        column(d, d), at::zeros({d / t}),                   // v
                        row(d, d), at::zeros({d}),                          // out
                        at::ones({d}), at::zeros({d}),                      // ln2
                        column(h, d), at::zeros({h / t}),                   // fc1
                        row(d, h), at::zeros({d})});                        // fc2
    }
    layers.push_back(
        {at::ones({d}), at::zeros({d}), rows(full({o.vocab, d}, 1 / std::sqrt(d)), padded_vocab)});
    for (auto& layer : layers) {
      for (auto& p : layer) p.requires_grad_(true);
    }
  }

  std::vector<at::Tensor> Params(int begin, int end) const {
    std::vector<at::Tensor> out;
    for (int i = begin; i < end; ++i) out.insert(out.end(), layers[i].begin(), layers[i].end());
    return out;
  }

  // Causal self-attention over this rank's heads: x [b, s, d] (normed,
  // replicated) -> [b, s, d] summed over the group.
  at::Tensor Attention(const std::vector<at::Tensor>& w, const at::Tensor& x) const {
    const at::Tensor in = np::CopyToGroup(x, tp);
    const std::int64_t b = x.size(0), s = x.size(1), hd = dim / (heads * t);
    auto split = [&](const at::Tensor& y) {  // [b, s, heads * hd] -> [b, heads, s, hd]
      return y.view({b, s, heads, hd}).transpose(1, 2);
    };
    const at::Tensor q = split(at::linear(in, w[2], w[3])), k = split(at::linear(in, w[4], w[5])),
                     v = split(at::linear(in, w[6], w[7]));
    const at::Tensor causal = at::ones({s, s}, at::kBool).triu(1);
    const at::Tensor att = at::matmul(q, k.transpose(-1, -2))
                               .div(std::sqrt(static_cast<double>(hd)))
                               .masked_fill(causal, -INFINITY)
                               .softmax(-1);
    const at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({b, s, heads * hd});
    return np::ReduceFromGroup(at::linear(y, w[8]), tp) + w[9];
  }

  // Layer i: tokens [b, s] -> activations [b, s, d] -> ... -> logits (this
  // rank's vocabulary part).
  at::Tensor Run(int i, const at::Tensor& x) const {
    const auto& w = layers[i];
    if (i == 0) {
      const std::int64_t part = padded_vocab / t, begin = r * part;
      at::Tensor local = x - begin;
      at::Tensor outside = (local < 0).logical_or(local >= part);
      at::Tensor e = at::embedding(w[0], local.masked_fill(outside, 0))
                         .masked_fill(outside.unsqueeze(-1), 0.0);
      return np::ReduceFromGroup(e, tp) + w[1].narrow(0, 0, x.size(1));
    }
    if (i + 1 == static_cast<int>(layers.size())) {
      const at::Tensor normed = at::layer_norm(x, {dim}, w[0], w[1]);
      return at::linear(np::CopyToGroup(normed, tp), w[2]);
    }
    at::Tensor y = x + Attention(w, at::layer_norm(x, {dim}, w[0], w[1]));
    const at::Tensor hidden =
        at::gelu(at::linear(np::CopyToGroup(at::layer_norm(y, {dim}, w[10], w[11]), tp), w[12],
                            w[13]));
    return y + np::ReduceFromGroup(at::linear(hidden, w[14]), tp) + w[15];
  }

  at::Tensor Loss(const at::Tensor& logits, const at::Tensor& targets) const {
    return np::VocabParallelCrossEntropy(logits, targets, tp, vocab).mean();
  }

  // The device model's forward time of layers [begin, end) at this token
  // count: every weight's matmul, and the attention's two per head.
  double ForwardMicros(int begin, int end, std::int64_t tokens) const {
    static const neuron::runtime::CostModel cost(neuron::runtime::DeviceSpec::FromEnvironment());
    const std::int64_t hd = dim / (heads * t);
    double us = 0;
    for (int i = std::max(begin, 1); i < end; ++i) {
      for (std::size_t k = 0; k < layers[i].size(); ++k) {
        if (layers[i][k].dim() != 2) continue;
        us += cost.Matmul(tokens, layers[i][k].size(1), layers[i][k].size(0), true).time.count();
      }
      if (i + 1 < static_cast<int>(layers.size())) {  // a block: scores and weighted values
        us += heads * (cost.Matmul(tokens, hd, seq, true).time.count() +
                       cost.Matmul(tokens, seq, hd, true).time.count());
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

// Every rank's memory, on rank 0: resident set and ZeRO model-state peak.
void PrintMemory(::c10d::ProcessGroup& world, const np::MeshLayout& layout, int rank) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const at::Tensor mine = at::tensor(
      {usage.ru_maxrss / 1024.0, np::ShardedModelStateMemory().peak / 1048576.0}, at::kDouble);
  std::vector<at::Tensor> in{mine};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world.getSize(); ++r) out[0].push_back(at::empty({2}, at::kDouble));
  world.allgather(out, in)->wait();
  if (rank != 0) return;
  std::printf("memory per rank (model state: ZeRO's sharded parameters, gradients and optimizer "
              "state; 0 without --zero):\n rank  tp  pp  dp  max RSS MiB  model-state peak MiB\n");
  for (int r = 0; r < world.getSize(); ++r) {
    const auto c = layout.Coordinates(r);
    std::printf("%5d %3d %3d %3d %12.0f %21.3f\n", r, c.tp, c.pp, c.dp,
                out[0][r][0].item<double>(), out[0][r][1].item<double>());
  }
  std::fflush(stdout);
}

// This stage's layers [begin, end): a balanced split by parameter count.
std::pair<int, int> StageLayers(const Model& model, int stages, int stage) {
  std::vector<double> costs;
  for (const auto& layer : model.layers) {
    double n = 0;
    for (const auto& p : layer) n += static_cast<double>(p.numel());
    costs.push_back(n);
  }
  const std::vector<int> starts = np::BalancedPartition(costs, stages);
  return {starts[stage], starts[stage + 1]};
}

// How gradients are averaged over data parallel: this stage's layers as
// one ZeRO unit, else DDP (without a pipeline) or AverageGradients after
// it; `trained` are the tensors the optimizer steps.
struct Averaging {
  std::unique_ptr<np::GradientReducer> reducer;
  std::unique_ptr<np::ShardedUnit> unit;
  std::vector<at::Tensor> trained;
};

Averaging MakeAveraging(const Options& o, const std::vector<at::Tensor>& params,
                        const np::ParallelGroups& groups, int stage) {
  Averaging a;
  a.trained = params;
  if (o.zero > 0) {
    a.unit = std::make_unique<np::ShardedUnit>(
        params, groups.data,
        np::ShardingOptions{o.zero, at::kFloat, at::kFloat, "stage " + std::to_string(stage)});
    a.trained = {a.unit->shard()};
  } else if (o.pp == 1) {
    a.reducer =
        std::make_unique<np::GradientReducer>(params, groups.data, np::ReducerOptions{});
  }
  return a;
}

// SGD with momentum 0.9 on `a.trained`; a ZeRO unit's full parameters are
// stale after it.
void SgdStep(Averaging& a, std::vector<at::Tensor>& momentum, double lr) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < a.trained.size(); ++i) {
    momentum[i].mul_(0.9).add_(a.trained[i].grad());
    a.trained[i].sub_(momentum[i] * lr);
    a.trained[i].mutable_grad().reset();
  }
  if (a.unit) {
    a.unit->MarkStale();
    np::SetOptimizerStateBytes(static_cast<std::uint64_t>(momentum[0].nbytes()));
  }
}

// Rank 0 prints the step: the loss (it lives on the last stage: summed over
// data parallel and stages), the slowest rank's wall and modelled times,
// tokens/s and resident memory.
void ReportStep(const np::ParallelGroups& groups, int step, const at::Tensor& loss,
                double wall, double modelled, std::int64_t tokens_per_step) {
  std::vector<at::Tensor> l{loss.detach().reshape({1}).clone()};
  groups.data->allreduce(l)->wait();
  groups.pipeline->allreduce(l)->wait();
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const double rss = Slowest(*groups.world, usage.ru_maxrss / 1024.0);
  if (groups.rank != 0) return;
  const int dp = groups.layout.size(np::Axis::kData);
  std::printf("step %d: loss %.4f | wall %.1f ms, %.0f tokens/s | modelled %.1f us, %.0f "
              "tokens/s | max RSS %.0f MiB\n",
              step, l[0].item<double>() / dp, wall * 1e3, tokens_per_step / wall, modelled,
              tokens_per_step / modelled * 1e6, rss);
  std::fflush(stdout);
}

// A forward of this stage's layers [begin, end) (a whole batch, or one
// microbatch): each arms one backward of the ZeRO unit (if any); ZeRO-3
// frees the parameters after it and gathers them again when backward
// reaches the stage's output.
struct StageForward {
  Model& model;
  int begin, end;
  np::ShardedUnit* unit;
  int zero;

  at::Tensor operator()(const at::Tensor& x) const {
    if (unit != nullptr) {
      unit->PrepareForBackward();
      unit->Gather();
    }
    at::Tensor y = x;
    for (int i = begin; i < end; ++i) y = model.Run(i, y);
    if (unit != nullptr && zero == 3) {
      unit->Free();
      if (y.requires_grad()) {
        np::ShardedUnit* u = unit;
        y.register_hook([u](const at::Tensor& g) {
          u->Gather();
          return g;
        });
      }
    }
    return y;
  }
};

// The job's groups, from the launcher's environment (torchrun's variables:
// rank 0 serves the rendezvous store on MASTER_ADDR:MASTER_PORT).
np::ParallelGroups Connect(const Options& o) {
  const int rank = EnvInt("RANK"), world = EnvInt("WORLD_SIZE");
  ::c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(EnvInt("MASTER_PORT"));
  so.isServer = rank == 0;
  so.numWorkers = world;
  auto store = c10::make_intrusive<::c10d::TCPStore>(std::getenv("MASTER_ADDR"), so);
  return np::InitializeParallel(store, rank, world, {o.tp, o.pp, o.dp});
}

int Run(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  np::ParallelGroups groups = Connect(o);
  const int rank = groups.rank;
  const int dp = groups.layout.size(np::Axis::kData);
  const int dp_rank = groups.layout.Coordinates(rank).dp;

  Model model(o, groups.tensor);
  const int stage = groups.layout.Coordinates(rank).pp;
  const auto [begin, end] = StageLayers(model, o.pp, stage);
  const std::vector<at::Tensor> params = model.Params(begin, end);
  Averaging averaging = MakeAveraging(o, params, groups, stage);
  auto& unit = averaging.unit;
  const StageForward forward{model, begin, end, unit.get(), o.zero};
  const std::int64_t micro_tokens = static_cast<std::int64_t>(o.batch) * o.seq / o.microbatches;
  const double layer_us = model.ForwardMicros(begin, end, micro_tokens);
  np::PipelineEngine engine(
      {1, o.microbatches, np::ScheduleKind::kOneForwardOneBackward, 0},
      [&](int, int, const at::Tensor& x) { return forward(x); },
      [&](const at::Tensor& logits, const at::Tensor& targets) {
        return model.Loss(logits, targets);
      },
      groups.pipeline, [&](int, const at::Tensor&) { return layer_us; });
  const double step_compute_us =
      3 * model.ForwardMicros(0, static_cast<int>(model.layers.size()),
                              static_cast<std::int64_t>(o.batch) * o.seq);
  std::vector<at::Tensor> momentum(averaging.trained.size());
  for (std::size_t i = 0; i < momentum.size(); ++i) momentum[i] = at::zeros_like(averaging.trained[i]);

  const at::Tensor data = np::SyntheticTokens({o.batch * dp * o.steps, o.seq, o.vocab, 7});
  np::ShardedBatches batches(data, {0, dp, dp_rank, true, 7, false}, o.batch);
  const std::int64_t tokens_per_step = static_cast<std::int64_t>(o.batch) * dp * o.seq;
  if (rank == 0) {
    std::printf("cpp_trainer: %s, ZeRO %d, %lld tokens per step\n",
                groups.layout.Describe().c_str(), o.zero, static_cast<long long>(tokens_per_step));
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
      if (!unit) np::AverageGradients(params, *groups.data);
      if (!loss.defined()) loss = at::zeros({});
    } else {
      if (averaging.reducer) averaging.reducer->PrepareForBackward();
      loss = model.Loss(forward(tokens), targets);
      loss.backward();
      clock->AdvanceCompute(neuron::runtime::SimDuration(step_compute_us));
    }
    SgdStep(averaging, momentum, o.lr);
    const double wall =
        Slowest(*groups.world, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             start).count());
    const double modelled = Slowest(*groups.world, clock->compute().count() - clock0);
    ReportStep(groups, step, loss, wall, modelled, tokens_per_step);
  }
  PrintMemory(*groups.world, groups.layout, rank);
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
