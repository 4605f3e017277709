#include "predict.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "child_process.h"
#include "neuron/parallel/layout_collectives.h"
#include "neuron/parallel/predicted_job.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/schedule.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/text_proto.h"
#include "neuron/runtime/topology.h"
#include "rank_env.h"
#include "temp_dir.h"

namespace neuron::launcher {

namespace fs = std::filesystem;
namespace pp = neuron::parallel;

namespace {

constexpr int kMaxWorld = 65536;

// What expert parallelism asks of the model and the layout (dp: the
// data-parallel ranks); InvalidUsage names the flag or the model file's field.
void CheckExperts(const PredictOptions& o, const pp::proto::DecoderModel& m, int dp) {
  NEURON_CHECK(o.ep >= 1 && o.ep <= kMaxWorld, "--ep must be between 1 and ", kMaxWorld,
               ", got ", o.ep);
  NEURON_CHECK(std::isfinite(o.capacity_factor) && o.capacity_factor >= 0 &&
                   o.capacity_factor <= 64,
               "--capacity-factor must be between 0 (the model's) and 64, got ",
               o.capacity_factor);
  if (m.experts() == 0) {
    NEURON_CHECK(o.ep == 1 && o.capacity_factor == 0, "--ep and --capacity-factor need a "
                 "Mixture of Experts; ", o.model_file, " has no experts (experts: 0)");
    return;
  }
  NEURON_CHECK(m.experts() % o.ep == 0, "--ep ", o.ep, " does not divide the ", m.experts(),
               " experts of ", o.model_file, " (experts)");
  NEURON_CHECK(dp % o.ep == 0, "--ep ", o.ep, " does not divide the data-parallel size ", dp,
               " (ranks / (tp ", o.tp, " x pp ", o.pp, ")): expert parallelism is carved "
               "out of data parallelism");
  NEURON_CHECK(!o.sequence_parallel, "--sequence-parallel with experts (", o.model_file,
               ") is not modelled: torchneuron.parallel.moe replicates a layer's tokens "
               "over tp");
}

// What the layout asks of the model and the cluster; InvalidUsage names it.
void CheckLayout(const PredictOptions& o, const pp::proto::DecoderModel& m, int world) {
  NEURON_CHECK(o.seq >= 1 && o.seq <= (1 << 22), "--seq must be between 1 and 4194304, got ",
               o.seq);
  NEURON_CHECK(o.micro_batch >= 1 && o.global_batch >= 1,
               "--micro-batch and --global-batch must be at least 1");
  NEURON_CHECK(o.tp >= 1 && o.pp >= 1 && o.dp >= 0, "--tp, --pp and --dp must be at least 1");
  NEURON_CHECK(o.zero >= 0 && o.zero <= 3, "--zero must be 0, 1, 2 or 3, got ", o.zero);
  NEURON_CHECK(o.checkpointing == "none" || o.checkpointing == "selective" ||
                   o.checkpointing == "full",
               "--activation-checkpointing must be none, selective or full, got '",
               o.checkpointing, "'");
  NEURON_CHECK(o.attention == "flash" || o.attention == "core",
               "--attention must be flash or core, got '", o.attention, "'");
  NEURON_CHECK(o.dtype == "bf16-mixed" || o.dtype == "bf16" || o.dtype == "fp32",
               "--dtype must be bf16-mixed, bf16 or fp32, got '", o.dtype, "'");
  NEURON_CHECK(m.heads() % o.tp == 0, "tp ", o.tp, " does not divide the model's ", m.heads(),
               " attention heads");
  NEURON_CHECK(m.kv_heads() % o.tp == 0 || o.tp % m.kv_heads() == 0, "tp ", o.tp,
               " and the model's ", m.kv_heads(), " kv heads must divide one another");
  NEURON_CHECK(m.ffn_hidden() % o.tp == 0, "tp ", o.tp, " does not divide ffn_hidden ",
               m.ffn_hidden());
  NEURON_CHECK(o.pp <= m.layers(), "pp ", o.pp, " is more than the model's ", m.layers(),
               " layers");
  NEURON_CHECK(!o.sequence_parallel || o.seq % o.tp == 0, "--sequence-parallel needs tp ", o.tp,
               " to divide --seq ", o.seq);
  NEURON_CHECK(world >= 1 && world <= kMaxWorld, "the job has ", world,
               " ranks; predict models 1 to ", kMaxWorld);
  NEURON_CHECK(world % (o.tp * o.pp) == 0, "tp ", o.tp, " x pp ", o.pp, " does not divide the ",
               world, " ranks of the cluster");
  const int dp = world / (o.tp * o.pp);
  NEURON_CHECK(o.dp == 0 || o.dp == dp, "--dp ", o.dp, " but the cluster's ", world,
               " ranks / (tp ", o.tp, " x pp ", o.pp, ") make dp ", dp);
  NEURON_CHECK(o.global_batch % (o.micro_batch * dp) == 0, "--global-batch ", o.global_batch,
               " is not a multiple of micro-batch ", o.micro_batch, " x dp ", dp);
  NEURON_CHECK(m.position() != "learned" || m.max_seq() == 0 || o.seq <= m.max_seq(), "--seq ",
               o.seq, " is longer than the model's ", m.max_seq(), " learned positions");
  CheckExperts(o, m, dp);
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::vector<std::string> CaptureArgs(const PredictOptions& o, const pp::proto::DecoderModel& m,
                                     int dp, const std::vector<int>& stages,
                                     const std::string& out) {
  std::vector<std::string> a = {
      "--layers", std::to_string(m.layers()), "--hidden", std::to_string(m.hidden()),
      "--heads", std::to_string(m.heads()), "--kv-heads", std::to_string(m.kv_heads()),
      "--ffn-hidden", std::to_string(m.ffn_hidden()), "--vocab", std::to_string(m.vocab()),
      "--activation", m.activation(), "--norm", m.norm(), "--position", m.position(),
      "--max-seq", std::to_string(m.max_seq()), "--tp", std::to_string(o.tp),
      "--dp", std::to_string(dp), "--zero", std::to_string(o.zero),
      "--seq", std::to_string(o.seq), "--micro-batch", std::to_string(o.micro_batch),
      "--checkpointing", o.checkpointing, "--attention", o.attention, "--dtype", o.dtype,
      "--stage-layers", Join(stages), "--out", out};
  if (m.rope_theta() > 0) {
    a.push_back("--rope-theta");
    a.push_back(std::to_string(m.rope_theta()));
  }
  if (o.sequence_parallel) a.push_back("--sequence-parallel");
  if (o.recompute_mlp) a.push_back("--recompute-mlp");
  if (m.experts() > 0) {
    const double factor = o.capacity_factor > 0 ? o.capacity_factor : pp::CapacityFactor(m);
    for (const std::string& x :
         {std::string("--experts"), std::to_string(m.experts()), std::string("--top-k"),
          std::to_string(m.top_k()), std::string("--capacity-factor"), std::to_string(factor),
          std::string("--ep"), std::to_string(o.ep)}) {
      a.push_back(x);
    }
  }
  return a;
}

// Runs python -m torchneuron.predict ARGS (`python`: "" for NEURON_PYTHON's);
// IoError with the end of its output, InvalidUsage when it refused its input.
void RunCapture(const std::string& python_name, const std::vector<std::string>& args,
                const fs::path& dir) {
  const std::string name =
      python_name.empty()
          ? runtime::ConfigRegistry::Get().GetString(runtime::ConfigKey::kPython)
          : python_name;
  const std::string python = ResolveProgram(name);
  NEURON_CHECK(!python.empty(), "python interpreter '", name,
               "' not found (set --python or NEURON_PYTHON)");
  SpawnRequest r;
  r.path = python;
  r.argv = {python, "-m", "torchneuron.predict"};
  r.argv.insert(r.argv.end(), args.begin(), args.end());
  Environment env = CurrentEnvironment();
  env["PYTHONPATH"] = NEURON_PYTHON_PACKAGE_DIR +
                      (env.count("PYTHONPATH") ? ":" + env["PYTHONPATH"] : std::string());
  env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0";
  for (const auto& [k, v] : env) r.env.push_back(k + "=" + v);
  r.output_file = (dir / "capture.log").string();
  const SpawnedChild child = Spawn(r);
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  std::string log = runtime::ReadTextFile(r.output_file, "capture log");
  if (log.size() > 4000) log = "..." + log.substr(log.size() - 4000);
  const bool usage = WIFEXITED(status) && WEXITSTATUS(status) == 2;
  const std::string message = StrCat("capturing the step failed: ", log);
  if (usage) throw InvalidUsage(message);
  throw IoError(message);
}


// The device's calibration (configs/predict/calibration.textproto): its
// fitted or assumed constants, and where they come from.
parallel::proto::DeviceCalibration Calibration(const std::string& file,
                                               const std::string& device) {
  const std::string path =
      file.empty() ? std::string(NEURON_SOURCE_DIR) + "/configs/predict/calibration.textproto"
                   : file;
  pp::proto::PredictCalibration all;
  runtime::ParseTextProto(runtime::ReadTextFile(path, "calibration"), path, "calibration", &all);
  for (const auto& d : all.devices()) {
    NEURON_CHECK(d.matmul_overhead_cycles() >= 0 && std::isfinite(d.matmul_overhead_cycles()),
                 path, ": ", d.device(), "'s matmul_overhead_cycles must be finite and >= 0");
    if (d.device() == device) return d;
  }
  throw InvalidUsage(StrCat(path, " has no calibration for the device \"", device,
                            "\" (give --matmul-overhead-cycles)"));
}

// The slowest stage's breakdown from its phases (the replay gives the step).
Breakdown StageBreakdown(const pp::StepCosts& costs, const pp::proto::StepCapture& capture,
                         const std::vector<int>& stages, int microbatches) {
  Breakdown worst;
  double worst_total = -1;
  const int last = static_cast<int>(stages.size()) - 1;
  for (int s = 0; s <= last; ++s) {
    Breakdown b;
    auto add = [&](const char* phase, double times) {
      const pp::PhaseCost& c = costs.at(phase);
      b.compute_us += c.compute_us * times;
      b.tp_comm_us += c.tp_collective_us * times;
      b.ep_comm_us += c.ep_collective_us * times;
      for (const auto& [engine, us] : c.engine_us) b.engine_us[engine] += us * times;
    };
    for (const char* dir : {"forward", "backward"}) {
      add((std::string("layer_") + dir).c_str(), double(stages[s]) * microbatches);
      if (s == 0) add((std::string("embed_") + dir).c_str(), microbatches);
      if (s == last) add((std::string("head_") + dir).c_str(), microbatches);
    }
    const pp::PhaseCost& opt = costs.at(pp::OptimizerPhase(capture.stage_parameters(s)));
    b.optimizer_us = opt.total_us();
    const double total = b.compute_us + b.tp_comm_us + b.ep_comm_us + b.optimizer_us;
    if (total > worst_total) {
      worst_total = total;
      worst = b;
    }
  }
  return worst;
}

}  // namespace

bool Prediction::fits() const {
  for (const auto& m : memory) {
    if (m.total() > hbm_capacity) return false;
  }
  return true;
}

namespace {

struct Cluster {
  runtime::Topology topology;
  int per_node = 0;
  int world = 0;
  std::vector<std::uint32_t> nodes() const {
    return std::vector<std::uint32_t>(static_cast<std::size_t>(world / per_node), per_node);
  }
};

// The nodes: --nodes, or (0) as many as tp x pp x --dp ranks fill, or one.
Cluster ResolveCluster(const PredictOptions& o) {
  NEURON_CHECK(o.nodes >= 0 && o.nodes <= 4096, "--nodes must be between 1 and 4096");
  Cluster c{o.topology_file.empty() ? runtime::Topology::Default()
                                    : runtime::Topology::FromFile(o.topology_file)};
  c.per_node = o.ranks_per_node > 0
                   ? o.ranks_per_node
                   : static_cast<int>(c.topology.spec().chips_per_node() *
                                      std::max(1u, c.topology.spec().ranks_per_chip()));
  int nodes = o.nodes;
  if (nodes == 0 && o.dp > 0) {
    const long long ranks = 1LL * o.tp * o.pp * o.dp;
    NEURON_CHECK(ranks % c.per_node == 0, "tp ", o.tp, " x pp ", o.pp, " x dp ", o.dp, " = ",
                 ranks, " ranks do not fill whole nodes of ", c.per_node,
                 " (give --nodes and --ranks-per-node)");
    NEURON_CHECK(ranks / c.per_node <= 4096, ranks, " ranks need more than 4096 nodes");
    nodes = static_cast<int>(ranks / c.per_node);
  }
  c.world = std::max(nodes, 1) * c.per_node;
  return c;
}

// The options' pricing, the calibration's overhead where none is given.
pp::PricingOptions ResolvePricing(const PredictOptions& o, const runtime::DeviceSpec& device,
                                  Prediction& p) {
  pp::PricingOptions pricing = o.pricing;
  if (pricing.matmul_overhead_cycles < 0) {
    const auto calibration = Calibration(o.calibration_file, device.spec().name());
    pricing.matmul_overhead_cycles = calibration.matmul_overhead_cycles();
    p.calibration_source = calibration.source();
  } else {
    p.calibration_source = "--matmul-overhead-cycles";
  }
  p.matmul_overhead_cycles = pricing.matmul_overhead_cycles;
  return pricing;
}

pp::PredictedLayout JobLayout(const PredictOptions& o, const Prediction& p,
                              const std::vector<int>& stages) {
  const pp::ParameterBytes bytes = pp::BytesPerParameter(o.dtype);
  const double act = bytes.weights;  // activations travel in the compute dtype
  pp::PredictedLayout layout;
  layout.tp = o.tp;
  layout.pp = o.pp;
  layout.dp = p.dp;
  layout.ep = o.ep;
  layout.microbatches = p.microbatches;
  layout.zero = o.zero;
  layout.gradient_bytes = bytes.gradients;
  layout.parameter_bytes = bytes.weights;
  layout.message_bytes =
      double(o.sequence_parallel ? o.seq / o.tp : o.seq) * o.micro_batch * p.model.hidden() * act;
  layout.stage_layers = stages;
  return layout;
}

std::vector<pp::StepMemory> StageMemory(const pp::proto::StepCapture& capture,
                                        const pp::PredictedLayout& layout,
                                        const std::string& dtype) {
  std::vector<pp::StepMemory> memory;
  for (int s = 0; s < layout.pp; ++s) {
    pp::MemoryLayout m;
    m.dtype = dtype;
    m.pp = layout.pp;
    m.dp = layout.dp;
    m.ep = layout.ep;
    m.zero = layout.zero;
    m.microbatches = layout.microbatches;
    m.stage_layers = layout.stage_layers[static_cast<std::size_t>(s)];
    m.message_bytes = layout.message_bytes;
    m.bucket_bytes = layout.bucket_bytes;
    memory.push_back(pp::EstimateStepMemory(capture, m, s));
  }
  return memory;
}

// The slowest rank's wait on pipeline messages, split: the transfers of the
// two messages it receives per microbatch (its input, its output's
// gradient; one at either end of the pipeline), as the fabric model moves
// them between neighbouring stages, and the rest, the bubble.
void PipelineWait(const runtime::FabricModel& fabric, const pp::PredictedLayout& layout,
                  double wait_us, Breakdown& b) {
  if (layout.pp == 1) return;
  const int next_stage = layout.tp * layout.dp;  // rank 0's neighbour (MeshLayout's order)
  const double transfer =
      fabric.Simulate(runtime::PointToPointSchedule(0, next_stage, layout.message_bytes))
          .total.count();
  b.pipeline_messages_us = std::min(wait_us, 2.0 * layout.microbatches * transfer);
  b.bubble_us = wait_us - b.pipeline_messages_us;
}

// The replayed step's figures: breakdown, throughput, MFU.
void StepFigures(const PredictOptions& o, const runtime::DeviceSpec& device,
                 const runtime::ReplayedStep& step, Prediction& p) {
  p.step_us = step.modelled_us;
  p.breakdown.dp_comm_us = step.collective_wait_us;
  p.seq_per_s = o.global_batch / (p.step_us * 1e-6);
  p.tokens_per_s = p.seq_per_s * o.seq;
  const double peak = device.PeakTflops(o.dtype == "fp32") * 1e12;
  p.mfu = 3 * pp::ForwardFlopsPerToken(p.model, o.seq) * p.tokens_per_s / (p.world * peak);
  p.model_parameters = pp::DecoderParameters(p.model);
  p.active_parameters = pp::ActiveParameters(p.model);
  p.hbm_capacity = static_cast<double>(device.spec().hbm().capacity_bytes());
}

}  // namespace

PreparedPrediction Prepare(const PredictOptions& o) {
  NEURON_CHECK(!o.model_file.empty(), "--model is required");
  PreparedPrediction r;
  Prediction& p = r.prediction;
  p.options = o;
  p.model = pp::LoadDecoderModel(o.model_file);
  const Cluster cluster = ResolveCluster(o);
  p.world = cluster.world;
  CheckLayout(o, p.model, p.world);
  p.dp = p.world / (o.tp * o.pp);
  p.microbatches = o.global_batch / (o.micro_batch * p.dp);
  cluster.topology.CheckFits(static_cast<std::uint32_t>(p.world / cluster.per_node),
                             cluster.nodes());
  r.topology = cluster.topology;
  r.ranks_per_node = cluster.per_node;
  r.device = o.device_file.empty() ? runtime::DeviceSpec::FromEnvironment()
                                   : runtime::DeviceSpec::FromFile(o.device_file);
  r.stages = pp::StageLayers(p.model, o.pp);
  return r;
}

std::vector<std::string> CaptureArgs(const PreparedPrediction& r, const std::string& out) {
  return CaptureArgs(r.prediction.options, r.prediction.model, r.prediction.dp, r.stages, out);
}

void RunCaptures(const std::string& python, const std::vector<std::vector<std::string>>& args) {
  TempDir dir("neuron-predict");
  const fs::path batch = dir.path() / "batch.tsv";
  {
    std::ofstream f(batch);
    for (const auto& line : args) {
      for (std::size_t i = 0; i < line.size(); ++i) f << (i ? "\t" : "") << line[i];
      f << "\n";
    }
    NEURON_CHECK(f.good(), "cannot write ", batch.string());
  }
  RunCapture(python, {"--batch", batch.string()}, dir.path());
}

Prediction Complete(const PreparedPrediction& r, const pp::proto::StepCapture& capture) {
  Prediction p = r.prediction;
  const PredictOptions& o = p.options;
  const runtime::DeviceSpec& device = *r.device;
  const std::vector<std::uint32_t> nodes(static_cast<std::size_t>(p.world / r.ranks_per_node),
                                         static_cast<std::uint32_t>(r.ranks_per_node));
  const runtime::FabricModel fabric(*r.topology, runtime::PlaceRanks(*r.topology, nodes),
                                    device);
  pp::LayoutCollectivePricer collectives(fabric, o.tp, o.ep);
  const pp::StepCosts costs = pp::PriceStep(
      capture, runtime::CostModel(device), ResolvePricing(o, device, p),
      [&](const std::string& k, double b, const std::string& a) { return collectives(k, b, a); });
  const pp::PredictedLayout layout = JobLayout(o, p, r.stages);
  const auto traces = pp::PredictedTraces(costs, capture, layout);
  const auto start = std::chrono::steady_clock::now();
  const runtime::ReplayResult replay = runtime::ReplayTraces(traces, fabric);
  p.replay_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  NEURON_ASSERT(replay.steps.size() == 1, "one predicted step, replayed as ",
                replay.steps.size());
  p.breakdown = StageBreakdown(costs, capture, r.stages, p.microbatches);
  StepFigures(o, device, replay.steps[0], p);
  PipelineWait(fabric, layout, replay.steps[0].message_wait_us, p.breakdown);
  p.memory = StageMemory(capture, layout, o.dtype);
  return p;
}

pp::proto::StepCapture LoadCapture(const std::string& path) {
  pp::proto::StepCapture capture;
  runtime::ParseTextProto(runtime::ReadTextFile(path, "step capture"), path, "step capture",
                          &capture);
  return capture;
}

Prediction Predict(const PredictOptions& o) {
  const PreparedPrediction r = Prepare(o);
  if (!o.capture_file.empty()) return Complete(r, LoadCapture(o.capture_file));
  TempDir dir("neuron-predict");
  const std::string out =
      o.capture_out.empty() ? (dir.path() / "step.textproto").string() : o.capture_out;
  RunCapture(o.python, CaptureArgs(r, out), dir.path());
  return Complete(r, LoadCapture(out));
}

}  // namespace neuron::launcher
