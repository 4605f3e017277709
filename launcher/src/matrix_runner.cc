// RunMatrix: each cell a neuronrun job (several agents for several nodes),
// results per cell in out/cells/ID/, then results.csv and report.md.
#include <google/protobuf/text_format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "child_process.h"
#include "matrix_replay.h"
#include "matrix_zygote.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/launcher/matrix.h"
#include "neuron/launcher/matrix_result.pb.h"
#include "neuron/parallel/pipeline_trace_scaling.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/fabric/trace_scaling.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/text_proto.h"
#include "ports.h"
#include "rank_env.h"

namespace neuron::launcher {

namespace {

namespace fs = std::filesystem;
using proto::CellResult;
using proto::RunFigures;

// A cell's result from an earlier run; NOT_RUN when there is none or it
// does not parse (the cell then runs again).
CellResult ReadResult(const fs::path& file) {
  CellResult result;
  if (!fs::exists(file)) return result;
  try {
    runtime::ParseTextProto(runtime::ReadTextFile(file.string(), "cell result"), file.string(),
                            "cell result", &result);
  } catch (const Error&) {
    result = CellResult();
  }
  return result;
}

void WriteResult(const fs::path& file, const CellResult& result) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(result, &text);
  runtime::WriteFileAtomically(file.string(), text);
}

// Starts `argv` with stdout and stderr appended to `log` and `extra_env`
// over this process's environment, and descriptor `pass_fd` (if >= 0) kept
// open; it dies with us (launcher Spawn).
pid_t Start(const std::vector<std::string>& argv, const fs::path& log,
            const Environment& extra_env, int pass_fd = -1) {
  SpawnRequest request;
  request.path = argv[0];
  request.argv = argv;
  request.pass_fd = pass_fd;
  Environment env = CurrentEnvironment();
  for (const auto& [name, value] : extra_env) env[name] = value;
  request.env = ToEnvp(env);
  request.output_file = log.string();
  return Spawn(request).pid;
}

std::vector<std::string> TrainerArgs(const MatrixSpec& spec, const MatrixCell& c,
                                     const fs::path& metrics, const fs::path& trace) {
  const auto& st = c.strategy;
  const auto& md = c.model;
  std::vector<std::string> a = {
      spec.script, "--tp", std::to_string(st.tp()), "--pp", std::to_string(st.pp()),
      "--zero", std::to_string(st.zero()), "--microbatches", std::to_string(st.microbatches()),
      "--steps", std::to_string(spec.matrix.steps()), "--batch", std::to_string(c.batch_per_dp),
      "--seq", std::to_string(md.seq()), "--dim", std::to_string(md.dim()), "--heads",
      std::to_string(md.heads()), "--layers", std::to_string(md.layers()), "--vocab",
      std::to_string(md.vocab()), "--metrics-out", metrics.string(), "--trace-out",
      trace.string()};
  if (st.sp()) a.push_back("--sp");
  if (c.compile) a.push_back("--compile");
  if (md.experts() > 0) {  // a Mixture of Experts: its trainer takes expert parallelism
    for (const std::string& x : {std::string("--ep"), std::to_string(st.ep()),
                                 std::string("--experts"), std::to_string(md.experts()),
                                 std::string("--top-k"), std::to_string(md.top_k())}) {
      a.push_back(x);
    }
  }
  return a;
}

// What went wrong, from the log: the last exception or error line (a
// rank's), else neuronrun's failure summary, else the last line.
std::string ErrorOf(const fs::path& log) {
  std::ifstream in(log);
  std::string line, error, summary, last;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (line.find("Error: ") != std::string::npos || line.find("error: ") != std::string::npos) {
      error = line;
    } else if (line.find("job failed") != std::string::npos) {
      summary = line;
    }
  }
  const std::string& best = !error.empty() ? error : !summary.empty() ? summary : last;
  const auto start = best.find_first_not_of(" \t");
  return start == std::string::npos ? best : best.substr(start);
}

ReplayLayout LayoutOf(const MatrixCell& c) { return {c.nodes, c.ranks_per_node, c.topology}; }

double TokensPerRankStep(const MatrixCell& c) {
  return static_cast<double>(c.batch_per_dp) * c.model.seq();
}

// The real cells' traces, each loaded once (a source feeds its own check,
// the larger cells' checks and the modelled cells), and each scaling of
// them made once (a modelled cell and a real cell's check may scale the
// same sources to the same tp and pp).
class TraceCache {
 public:
  using Traces = std::vector<runtime::proto::RankTrace>;

  const Traces& Of(const fs::path& dir) {
    auto it = loaded_.find(dir.string());
    if (it == loaded_.end()) {
      it = loaded_.emplace(dir.string(), runtime::LoadJobTraces(dir.string())).first;
    }
    return it->second;
  }

  // `source`'s traces scaled to tp with `tp_source`'s (when not empty),
  // then to pp when that is above the source's (0: not).
  const Traces& Scaled(const fs::path& source, const fs::path& tp_source, int tp,
                       int pp) {
    const auto key = std::make_tuple(source.string(), tp_source.string(), tp, pp);
    auto it = scaled_.find(key);
    if (it != scaled_.end()) return it->second;
    Traces traces = tp_source.empty()
                        ? Of(source)
                        : runtime::ScaleTensorParallel(Of(source), Of(tp_source), tp);
    if (pp > 0) traces = parallel::ScalePipeline(traces, pp);
    return scaled_.emplace(key, std::move(traces)).first->second;
  }

 private:
  std::map<std::string, Traces> loaded_;
  std::map<std::tuple<std::string, std::string, int, int>, Traces> scaled_;
};

// The figures of cell `c` replayed from real cell `source`'s trace, scaled
// to c's tp with real cell `tp_source`'s when that is not -1, and to c's pp
// when the source's is smaller.
RunFigures ReplayAs(const MatrixSpec& spec, const MatrixCell& c, int source,
                    int tp_source, const fs::path& cells, TraceCache& traces) {
  auto dir = [&](int i) {
    return cells / spec.cells[static_cast<std::size_t>(i)].id / "trace";
  };
  const bool deeper = spec.cells[static_cast<std::size_t>(source)].strategy.pp() <
                      std::max(1, c.strategy.pp());
  if (tp_source < 0 && !deeper) {
    return ReplayFigures(traces.Of(dir(source)), LayoutOf(c), TokensPerRankStep(c));
  }
  return ReplayFigures(
      traces.Scaled(dir(source), tp_source < 0 ? fs::path() : dir(tp_source),
                    c.strategy.tp(), deeper ? c.strategy.pp() : 0),
      LayoutOf(c), TokensPerRankStep(c));
}

// What a cell replays from, as the report names it: "a" or "a+b".
std::string SourceName(const MatrixSpec& spec, int source, int tp_source) {
  std::string name = spec.cells[static_cast<std::size_t>(source)].id;
  if (tp_source >= 0) name += "+" + spec.cells[static_cast<std::size_t>(tp_source)].id;
  return name;
}

// A real cell's check of the replay (docs/scaling.md): its own trace
// replayed on its own layout, and what a modelled cell like it would be
// replayed from (ReplaySources) scaled to it, against its real modelled
// step time.
void CheckReplay(const MatrixSpec& spec, const MatrixCell& c, const fs::path& dir,
                 TraceCache& traces, CellResult& result) {
  try {
    const double real = result.figures().modelled_step_us();
    NEURON_CHECK(real > 0, "the cell's modelled step is ", real, " us");
    const RunFigures own =
        ReplayFigures(traces.Of(dir / "trace"), LayoutOf(c), TokensPerRankStep(c));
    result.set_replayed_step_us(own.modelled_step_us());
    const auto [from, tp_from] = ReplaySources(spec, c);
    if (from < 0) return;
    for (const int i : {from, tp_from}) {
      if (i >= 0 && !fs::exists(dir.parent_path() /
                                spec.cells[static_cast<std::size_t>(i)].id / "trace")) {
        return;
      }
    }
    result.set_scaled_from(SourceName(spec, from, tp_from));  // named if it fails too
    const RunFigures scaled = ReplayAs(spec, c, from, tp_from, dir.parent_path(), traces);
    result.set_scaled_replay_step_us(scaled.modelled_step_us());
    result.set_scaled_replay_error_pct(100.0 * (scaled.modelled_step_us() - real) / real);
  } catch (const std::exception& e) {
    result.set_replay_error(e.what());
  }
}

// A modelled cell: its source cell's trace (scaled to its tp with its
// tp_source's) replayed on its layout.
CellResult ModelCell(const MatrixSpec& spec, const MatrixCell& c, const fs::path& cells,
                     const std::vector<CellResult>& results, TraceCache& traces) {
  CellResult result;
  result.set_modelled_from(SourceName(spec, c.source, c.tp_source));
  for (const int i : {c.source, c.tp_source}) {
    if (i < 0 || results[static_cast<std::size_t>(i)].status() == CellResult::COMPLETED) {
      continue;
    }
    result.set_status(CellResult::FAILED);
    result.set_error("its recording cell " + spec.cells[static_cast<std::size_t>(i)].id +
                     " did not complete");
    return result;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    *result.mutable_figures() = ReplayAs(spec, c, c.source, c.tp_source, cells, traces);
    result.set_status(CellResult::MODELLED);
  } catch (const std::exception& e) {
    result.set_status(CellResult::FAILED);
    result.set_error(e.what());
  }
  result.set_wall_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

// Starts one agent of a cell (Start), with a connection of its own to the
// matrix's zygote (NEURON_ZYGOTE_FD) if there is one.
pid_t StartAgent(const std::vector<std::string>& argv, const fs::path& log,
                 Environment env, MatrixZygote& zygote, std::ostream& progress) {
  const int fd = zygote.Connect(progress);
  if (fd >= 0) env[runtime::VariableName(runtime::ConfigKey::kZygoteFd)] = std::to_string(fd);
  pid_t pid = -1;
  try {
    pid = Start(argv, log, env, fd);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  if (fd >= 0) ::close(fd);  // the agent holds it now
  return pid;
}

// Runs one cell: COMPLETED with the trainer's figures, or FAILED with what
// went wrong.
CellResult RunCell(const MatrixSpec& spec, const MatrixCell& c, const fs::path& dir,
                   const std::string& neuronrun, MatrixZygote& zygote, std::ostream& progress) {
  fs::create_directories(dir);
  const fs::path log = dir / "output.log", metrics = dir / "metrics.textproto", trace = dir / "trace";
  fs::remove(log);
  fs::remove(metrics);
  fs::remove_all(trace);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> common;
  if (!c.topology.empty()) common = {"--topology", c.topology};
  // The ranks fork from one interpreter that imported what the trainers
  // use (zygote.h): the matrix's, unless it imported with other settings
  // than the cell's (a topology of its own), then the cell's own; unless
  // NEURON_PRELOAD (even empty) says otherwise.
  if (!runtime::ConfigRegistry::Get().IsSet(runtime::ConfigKey::kPreload)) {
    common.insert(common.end(), {"--preload", NEURON_TRAINER_MODULES});
  }
  std::vector<pid_t> agents;
  Environment env;
  auto start_agent = [&](const std::vector<std::string>& argv) {
    agents.push_back(StartAgent(argv, log, env, zygote, progress));
  };
  if (c.compile) {  // a fresh compile cache: the cell's compile time is cold
    fs::remove_all(dir / "cache");
    env["NEURON_CACHE_DIR"] = (dir / "cache").string();
  }
  if (c.nodes == 1) {
    std::vector<std::string> argv = {neuronrun, "-n", std::to_string(c.ranks_per_node)};
    argv.insert(argv.end(), common.begin(), common.end());
    for (auto& a : TrainerArgs(spec, c, metrics, trace)) argv.push_back(a);
    start_agent(argv);
  } else {  // one agent per simulated node, rendezvous on this machine
    const std::string endpoint = "127.0.0.1:" + std::to_string(PickFreePort());
    env["NEURON_RDZV_SECRET"] = collectives::auth::GenerateSecret();
    for (int node = 0; node < c.nodes; ++node) {
      std::vector<std::string> argv = {neuronrun, "--nnodes", std::to_string(c.nodes),
                                       "--node-rank", std::to_string(node), "--rdzv-endpoint",
                                       endpoint, "-n", std::to_string(c.ranks_per_node)};
      argv.insert(argv.end(), common.begin(), common.end());
      for (auto& a : TrainerArgs(spec, c, metrics, trace)) argv.push_back(a);
      start_agent(argv);
    }
  }
  int failed = 0;
  for (pid_t pid : agents) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  CellResult result;
  result.set_wall_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (failed > 0 || !fs::exists(metrics)) {
    result.set_status(CellResult::FAILED);
    result.set_error(ErrorOf(log));
    return result;
  }
  try {  // the trainer's figures, a RunFigures text proto
    runtime::ParseTextProto(runtime::ReadTextFile(metrics.string(), "trainer figures"),
                            metrics.string(), "trainer figures", result.mutable_figures());
    const RunFigures& f = result.figures();
    NEURON_CHECK(f.has_loss() && f.has_modelled_step_us(), "trainer figures ",
                 metrics.string(),
                 ": no loss or modelled_step_us (not a finished run's)");
    result.set_status(CellResult::COMPLETED);
  } catch (const Error& e) {
    result.set_status(CellResult::FAILED);
    result.set_error(e.what());
    result.clear_figures();
  }
  return result;
}

// A figure the result may lack (NaN: an empty CSV field, "-" in reports).
double Maybe(bool present, double value) { return present ? value : std::nan(""); }

std::string Fixed(double v, int digits) {
  if (std::isnan(v)) return "";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

std::string Csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

// The cell a cell's efficiency and loss are compared with: the first cell
// with the fewest ranks among those of the same strategy, model, compile
// mode and topology.
std::vector<int> Baselines(const MatrixSpec& spec) {
  std::vector<int> base(spec.cells.size());
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& c = spec.cells[i];
    int best = static_cast<int>(i);
    for (std::size_t j = 0; j < spec.cells.size(); ++j) {
      const MatrixCell& d = spec.cells[j];
      if (d.strategy.name() == c.strategy.name() && d.model.name() == c.model.name() &&
          d.compile == c.compile &&
          d.topology == c.topology && d.world() < spec.cells[best].world()) {
        best = static_cast<int>(j);
      }
    }
    base[i] = best;
  }
  return base;
}

std::string ModelledNote(const MatrixSpec& spec) {
  int modelled = 0;
  for (const auto& c : spec.cells) modelled += c.modelled ? 1 : 0;
  if (modelled == 0) return "Every cell ran as a real job (none modelled).";
  return StrCat(
      modelled, " cells of more than ", spec.matrix.max_real_ranks(),
      " ranks are modelled, not run: status \"modelled\", the trace of the real "
      "cell named in results.csv's modelled_from replayed on their layout (\"a+b\": "
      "the traces of two real cells at other tp sizes scaled to its tp first; a "
      "source at a smaller pp is scaled to its pp first; no loss, wall time or "
      "memory).");
}

const char* StatusName(CellResult::Status status) {
  switch (status) {
    case CellResult::COMPLETED: return "completed";
    case CellResult::FAILED: return "failed";
    case CellResult::MODELLED: return "modelled";
    default: return "not run";
  }
}

bool HasFigures(const CellResult& r) {
  return r.status() == CellResult::COMPLETED || r.status() == CellResult::MODELLED;
}

// A figure as the reports print it: NaN (an empty CSV field) where the cell
// has no figures or the figure is absent (a modelled cell's loss, ...).
double Figure(const CellResult& r, double value, bool present = true) {
  return HasFigures(r) ? Maybe(present, value) : std::nan("");
}

// A cell's figures as both reports print them, each read once: NaN where
// the cell has none; loss diff and efficiency against its baseline `b`.
struct Row {
  double loss, diff, first_step_ms, wall_step_ms, modelled_step_us, compute_us,
      exposed_comm_us, bubble_us, wall_tokens_per_s, tokens_per_s_per_device, efficiency,
      max_rss_mib, model_state_mib, cold_compile_ms, warm_compile_ms;
};

Row RowOf(const CellResult& r, const CellResult& b) {
  const RunFigures& f = r.figures();
  const RunFigures& base = b.figures();
  Row w{};
  w.loss = Figure(r, f.loss(), f.has_loss());
  w.diff = w.loss - Figure(b, base.loss(), base.has_loss());
  w.first_step_ms = Figure(r, f.first_step_ms(), f.has_first_step_ms());
  w.wall_step_ms = Figure(r, f.wall_step_ms(), f.has_wall_step_ms());
  w.modelled_step_us = Figure(r, f.modelled_step_us(), f.has_modelled_step_us());
  w.compute_us = Figure(r, f.compute_us(), f.has_compute_us());
  w.exposed_comm_us = Figure(r, f.exposed_comm_us(), f.has_exposed_comm_us());
  w.bubble_us = Figure(r, f.bubble_us(), f.has_bubble_us());
  w.wall_tokens_per_s = Figure(r, f.wall_tokens_per_s(), f.has_wall_tokens_per_s());
  w.tokens_per_s_per_device = Figure(r, f.modelled_tokens_per_s_per_device(),
                                     f.has_modelled_tokens_per_s_per_device());
  w.efficiency = w.tokens_per_s_per_device /
                 Figure(b, base.modelled_tokens_per_s_per_device(),
                        base.has_modelled_tokens_per_s_per_device());
  w.max_rss_mib = Figure(r, f.max_rss_mib(), f.has_max_rss_mib());
  w.model_state_mib = Figure(r, f.model_state_mib(), f.has_model_state_mib());
  w.cold_compile_ms = Figure(r, f.cold_compile_ms(), f.has_cold_compile_ms());
  w.warm_compile_ms = Figure(r, f.warm_compile_ms(), f.has_warm_compile_ms());
  return w;
}

// The replay against the real runs: each real cell's modelled step, its own
// trace replayed, and a smaller cell's trace scaled up to it.
std::string ReplayCheck(const MatrixSpec& spec, const std::vector<CellResult>& results) {
  std::ostringstream md;
  double worst = 0;
  int checked = 0, refused = 0;
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const CellResult& r = results[i];
    if (r.scaled_from().empty() && r.replay_error().empty()) continue;
    if (checked++ == 0) {
      md << "\n## Replay against real runs\n\nEach real cell's modelled step time, its "
            "own trace replayed on its layout, and the trace of a smaller real cell "
            "scaled up to it, or the traces of two real cells at other tp sizes scaled "
            "to its tp, or that of a real cell at a smaller pp scaled to its pp (what a "
            "modelled cell does); target: within 2%.\n\n| cell | real us | own trace us "
            "| "
            "scaled from | scaled us | error |\n|---|---|---|---|---|---|\n";
    }
    const double error = Maybe(r.has_scaled_replay_error_pct(), r.scaled_replay_error_pct());
    worst = std::max(worst, std::fabs(error));
    std::string shown = Fixed(error, 2) + "%";
    if (!r.replay_error().empty()) {  // the replay refused: say why
      ++refused;
      shown = "refused: " + r.replay_error();
      std::replace(shown.begin(), shown.end(), '|', '/');
      std::replace(shown.begin(), shown.end(), '\n', ' ');
    }
    const RunFigures& f = r.figures();
    md << "| " << spec.cells[i].id << " | "
       << Fixed(Maybe(f.has_modelled_step_us(), f.modelled_step_us()), 2) << " | "
       << Fixed(Maybe(r.has_replayed_step_us(), r.replayed_step_us()), 2) << " | "
       << r.scaled_from() << " | "
       << Fixed(Maybe(r.has_scaled_replay_step_us(), r.scaled_replay_step_us()), 2)
       << " | " << shown << " |\n";
  }
  if (checked > 0) {
    md << "\nLargest error: " << Fixed(worst, 2) << "% over " << checked - refused
       << " cells" << (refused > 0 ? StrCat("; ", refused, " refused") : "") << ".\n";
  }
  return md.str();
}

// The memory phases the cells' trainers reported: "load", "compile",
// "warmup", "step" in that order when present, then any others by name.
std::vector<std::string> MemoryPhases(const std::vector<CellResult>& results) {
  std::set<std::string> seen;
  for (const auto& r : results) {
    for (const auto& [phase, mib] : r.figures().peak_allocated_mib_by_phase()) seen.insert(phase);
  }
  std::vector<std::string> phases;
  for (const char* known : {"load", "compile", "warmup", "step"}) {
    if (seen.erase(known) > 0) phases.push_back(known);
  }
  phases.insert(phases.end(), seen.begin(), seen.end());
  return phases;
}

// A cell's peak allocated MiB in `phase`: NaN (an empty field) when absent.
double PhasePeak(const CellResult& r, const std::string& phase) {
  const auto& peaks = r.figures().peak_allocated_mib_by_phase();
  const auto it = peaks.find(phase);
  return Figure(r, it == peaks.end() ? 0 : it->second, it != peaks.end());
}

// The cells' device memory by phase (trainers on "neuron"), when any has it.
std::string PhaseMemory(const MatrixSpec& spec, const std::vector<CellResult>& results,
                        const std::vector<std::string>& phases) {
  if (phases.empty()) return "";
  std::ostringstream md;
  md << "\n## Device memory by phase\n\nPeak allocated device memory (MiB; the largest "
        "rank's, `torch.neuron.memory_phase_peaks`) in each memory phase the trainer set: "
        "load (the model built and sharded), warmup (the first step: it compiles and makes "
        "the optimizer state), step (the steps after).\n\n| cell |";
  for (const auto& p : phases) md << " " << p << " |";
  md << "\n|---|";
  for (std::size_t i = 0; i < phases.size(); ++i) md << "---|";
  md << "\n";
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    if (results[i].figures().peak_allocated_mib_by_phase().empty()) continue;
    md << "| " << spec.cells[i].id << " |";
    for (const auto& p : phases) md << " " << Fixed(PhasePeak(results[i], p), 3) << " |";
    md << "\n";
  }
  return md.str();
}

// The compiled cells' compile time: IR to executables, the slowest rank's,
// with an empty compile cache (cold) and loading from the disk cache (warm).
std::string CompileTimes(const MatrixSpec& spec, const std::vector<CellResult>& results) {
  std::ostringstream md;
  int rows = 0;
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const RunFigures& f = results[i].figures();
    if (!spec.cells[i].compile || !HasFigures(results[i]) || !f.has_cold_compile_ms())
      continue;
    if (rows++ == 0) {
      md << "\n## Compile time\n\nIR to executables, the slowest rank's: cold (an empty "
            "compile cache, the cell's own) and warm (the same graphs loaded from the disk "
            "cache, as a rerun would).\n\n| cell | cold ms | warm ms | cold / warm |\n"
            "|---|---|---|---|\n";
    }
    const double cold = f.cold_compile_ms();
    const double warm = Maybe(f.has_warm_compile_ms(), f.warm_compile_ms());
    md << "| " << spec.cells[i].id << " | " << Fixed(cold, 1) << " | " << Fixed(warm, 2)
       << " | " << Fixed(cold / warm, 1) << "x |\n";
  }
  return md.str();
}

// results.csv's header: the cell, then its figures, then one column per
// collective kind in `ops`, then one per memory phase in `phases`.
std::string CsvHeader(const std::set<std::string>& ops, const std::vector<std::string>& phases) {
  std::string header =
      "cell,strategy,nodes,ranks_per_node,world,tp,pp,dp,ep,zero,sp,microbatches,model,"
      "compile,"
      "topology,status,error,loss,loss_diff,first_step_ms,wall_step_ms,modelled_step_us,"
      "compute_us,exposed_comm_us,bubble_us,wall_tokens_per_s,"
      "modelled_tokens_per_s_per_device,scaling_efficiency,max_rss_mib,model_state_mib,"
      "cold_compile_ms,warm_compile_ms,modelled_from,replayed_step_us,scaled_from,"
      "scaled_replay_step_us,scaled_replay_error_pct,replay_error";
  for (const auto& op : ops) header += ",bytes_per_step_" + op;
  for (const auto& phase : phases) header += ",peak_allocated_mib_" + phase;
  return header + "\n";
}

// One cell's row of results.csv; `w` its figures (RowOf).
std::string CsvRow(const MatrixCell& c, const CellResult& r, const Row& w,
                   const std::set<std::string>& ops, const std::vector<std::string>& phases) {
  std::ostringstream csv;
  csv << Csv(c.id) << "," << Csv(c.strategy.name()) << "," << c.nodes << ","
      << c.ranks_per_node << "," << c.world() << "," << c.strategy.tp() << ","
      << c.strategy.pp() << "," << c.dp() << "," << c.strategy.ep() << ","
      << c.strategy.zero() << ","
      << (c.strategy.sp() ? 1 : 0) << "," << c.strategy.microbatches() << ","
      << Csv(c.model.name()) << "," << (c.compile ? 1 : 0) << "," << Csv(c.topology)
      << "," << StatusName(r.status()) << "," << Csv(r.error()) << "," << Fixed(w.loss, 6)
      << "," << Fixed(w.diff, 6) << "," << Fixed(w.first_step_ms, 2) << ","
      << Fixed(w.wall_step_ms, 2) << "," << Fixed(w.modelled_step_us, 2) << ","
      << Fixed(w.compute_us, 2) << "," << Fixed(w.exposed_comm_us, 2) << ","
      << Fixed(w.bubble_us, 2) << "," << Fixed(w.wall_tokens_per_s, 1) << ","
      << Fixed(w.tokens_per_s_per_device, 1) << "," << Fixed(w.efficiency, 4) << ","
      << Fixed(w.max_rss_mib, 1) << "," << Fixed(w.model_state_mib, 3) << ","
      << Fixed(w.cold_compile_ms, 1) << "," << Fixed(w.warm_compile_ms, 1) << ","
      << Csv(r.modelled_from()) << ","
      << Fixed(Maybe(r.has_replayed_step_us(), r.replayed_step_us()), 2) << ","
      << Csv(r.scaled_from()) << ","
      << Fixed(Maybe(r.has_scaled_replay_step_us(), r.scaled_replay_step_us()), 2) << ","
      << Fixed(Maybe(r.has_scaled_replay_error_pct(), r.scaled_replay_error_pct()), 3)
      << "," << Csv(r.replay_error());
  const RunFigures& f = r.figures();
  for (const auto& op : ops) {
    const auto it = f.bytes_per_step().find(op);
    const bool present = it != f.bytes_per_step().end();
    csv << "," << Fixed(Figure(r, present ? it->second : 0, present), 0);
  }
  for (const auto& phase : phases) csv << "," << Fixed(PhasePeak(r, phase), 3);
  csv << "\n";
  return csv.str();
}

// One cell's row of report.md's table; `w` its figures (RowOf).
std::string ReportRow(const MatrixCell& c, const CellResult& r, const Row& w) {
  const bool ok = r.status() == CellResult::COMPLETED;
  std::ostringstream md;
  md << "| " << c.id << " | " << c.world() << " | " << c.strategy.tp() << " x "
     << c.strategy.pp() << " x " << c.dp()
     << (c.strategy.ep() > 1 ? StrCat(" (ep ", c.strategy.ep(), ")") : "") << " | "
     << c.strategy.zero() << " | "
     << (ok || r.status() == CellResult::MODELLED ? StatusName(r.status()) : "**failed**")
     << " | " << (ok ? Fixed(w.loss, 4) + " (" + Fixed(w.diff, 4) + ")" : "-") << " | "
     << (ok ? Fixed(w.wall_step_ms, 1) : "-") << " | " << Fixed(w.modelled_step_us, 1)
     << " (" << Fixed(w.compute_us, 1) << " / " << Fixed(w.exposed_comm_us, 1) << " / "
     << Fixed(w.bubble_us, 1) << ") | " << Fixed(w.tokens_per_s_per_device, 0) << " | "
     << Fixed(w.efficiency, 3) << " | " << Fixed(w.model_state_mib, 2) << " | "
     << Fixed(w.max_rss_mib, 0) << " |\n";
  return md.str();
}

// report.md's opening: what made it, the axes and how to read the figures.
std::string ReportHeader(const MatrixSpec& spec, const fs::path& out) {
  const bool weak = spec.matrix.scaling() == proto::WEAK;
  std::ostringstream md;
  md << "# Scaling matrix: " << spec.matrix.name() << "\n\n"
     << "Made by `neuronrun matrix " << spec.path << " --out " << out.string() << "`. "
     << "From `" << spec.path << "`: " << spec.cells.size() << " cells, "
     << (weak ? "weak" : "strong") << " scaling (" << spec.matrix.batch() << " sequences "
     << (weak ? "per data-parallel rank" : "per step") << "), " << spec.matrix.steps()
     << " steps each; figures are medians over the steps after the first, the slowest rank's. "
        "Efficiency: modelled tokens/s per device against the cell's baseline (the fewest "
        "ranks with the same strategy and model); loss diff: against the same baseline. "
     << ModelledNote(spec) << "\n\n"
     << "| cell | ranks | tp x pp x dp | ZeRO | status | loss (diff) | wall step ms | modelled "
        "step us (compute / exposed comm / bubble) | modelled tokens/s/device | efficiency | "
        "model-state MiB | max RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  return md.str();
}

void WriteReports(const MatrixSpec& spec, const std::vector<CellResult>& results,
                  const fs::path& out) {
  const std::vector<int> base = Baselines(spec);
  std::set<std::string> ops;
  for (const auto& r : results) {
    for (const auto& [op, bytes] : r.figures().bytes_per_step()) ops.insert(op);
  }
  const std::vector<std::string> phases = MemoryPhases(results);
  std::string csv = CsvHeader(ops, phases), md = ReportHeader(spec, out);
  std::vector<std::string> failures;
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& c = spec.cells[i];
    const CellResult& r = results[i];
    const CellResult& b = results[static_cast<std::size_t>(base[i])];
    const Row w = RowOf(r, b);
    csv += CsvRow(c, r, w, ops, phases);
    md += ReportRow(c, r, w);
    if (!HasFigures(r)) failures.push_back(c.id + ": " + r.error());
  }
  md += ReplayCheck(spec, results) + CompileTimes(spec, results) +
        PhaseMemory(spec, results, phases);
  md += "\n![scaling efficiency](efficiency.png)\n\n![modelled step time breakdown]"
        "(breakdown.png)\n\n![memory per rank](memory.png)\n";
  if (!failures.empty()) {
    md += "\n## Failed cells\n\n";
    for (const auto& f : failures) md += "- " + f + "\n";
  }
  runtime::WriteFileAtomically((out / "results.csv").string(), csv);
  runtime::WriteFileAtomically((out / "report.md").string(), md);
}

}  // namespace

int RunMatrix(const MatrixSpec& spec, const std::string& out_dir, const std::string& neuronrun,
              const std::vector<std::string>& plotter, std::ostream& progress) {
  const fs::path out(out_dir);
  fs::create_directories(out / "cells");
  std::vector<CellResult> results(spec.cells.size());
  TraceCache traces;
  // What the matrix's trainers import (examples/04, 08, 09): torch, Dynamo
  // for the compiled cells, FSDP2, DTensor's tensor parallelism, pipelining.
  MatrixZygote zygote;
  int done = 0, failed = 0, skipped = 0, position = 0;
  const int total = static_cast<int>(spec.cells.size());
  // Real cells first: the replay checks and the modelled cells use their traces.
  for (const bool modelled : {false, true}) {
    for (int i = 0; i < total; ++i) {
      const MatrixCell& c = spec.cells[i];
      if (c.modelled != modelled) continue;
      const fs::path dir = out / "cells" / c.id;
      const fs::path result_file = dir / "result.textproto";
      CellResult result = ReadResult(result_file);
      // A real cell ran before (a result marked "modelled" came from a run
      // with another max_real_ranks: it is run for real now).
      const bool ran = result.status() == CellResult::COMPLETED;
      if (ran && !modelled) {
        ++skipped;
      } else {
        progress << "[matrix " << spec.matrix.name() << "] " << (modelled ? "modelling " : "running ")
                 << c.id << " (" << (position + 1) << "/" << total << ": done " << done
                 << ", failed " << failed << ", left " << total - position << ")" << std::endl;
        fs::create_directories(dir);
        result = modelled ? ModelCell(spec, c, out / "cells", results, traces)
                          : RunCell(spec, c, dir, neuronrun, zygote, progress);
        WriteResult(result_file, result);
      }
      ++position;
      if (HasFigures(result)) {
        ++done;
      } else {
        ++failed;
        progress << "[matrix " << spec.matrix.name() << "] cell " << c.id
                 << " failed: " << result.error() << std::endl;
      }
      results[i] = std::move(result);
    }
    if (!modelled) {  // every real cell's trace is there now
      for (int i = 0; i < total; ++i) {
        const MatrixCell& c = spec.cells[i];
        if (c.modelled || results[i].status() != CellResult::COMPLETED) continue;
        CheckReplay(spec, c, out / "cells" / c.id, traces, results[i]);
        WriteResult(out / "cells" / c.id / "result.textproto", results[i]);
      }
    }
  }
  WriteReports(spec, results, out);
  if (!plotter.empty()) {
    std::vector<std::string> argv = plotter;
    argv.push_back((out / "results.csv").string());
    argv.push_back(out.string());
    const fs::path log = out / "plots.log";
    fs::remove(log);
    int status = 0;
    ::waitpid(Start(argv, log, {}), &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      progress << "[matrix " << spec.matrix.name() << "] plots failed: " << ErrorOf(log)
               << std::endl;
      return 1;
    }
  }
  progress << "[matrix " << spec.matrix.name() << "] " << total << " cells: " << done
           << " completed or modelled (" << skipped << " from an earlier run), " << failed
           << " failed; "
           << (out / "results.csv").string() << ", " << (out / "report.md").string()
           << std::endl;
  return failed == 0 ? 0 : 1;
}

}  // namespace neuron::launcher
