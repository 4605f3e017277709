// RunMatrix: each cell a neuronrun job (several agents for several nodes),
// results per cell in out/cells/ID/, then results.csv and report.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
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

#include "neuron/collectives/store/auth.h"
#include "neuron/launcher/matrix.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "ports.h"

namespace neuron::launcher {

namespace {

namespace fs = std::filesystem;
using Figures = std::map<std::string, std::string>;

// "key = value" lines.
Figures ReadFigures(const fs::path& file) {
  Figures out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

void WriteFigures(const fs::path& file, const Figures& figures) {
  std::string text;
  for (const auto& [k, v] : figures) text += k + " = " + v + "\n";
  runtime::WriteFileAtomically(file.string(), text);
}

// Starts `argv` with stdout and stderr appended to `log`; it dies with us.
pid_t Start(const std::vector<std::string>& argv, const fs::path& log,
            const std::vector<std::string>& extra_env) {
  const pid_t pid = ::fork();
  NEURON_CHECK(pid >= 0, "matrix: fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    for (const auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

std::vector<std::string> TrainerArgs(const MatrixSpec& spec, const MatrixCell& c,
                                     const fs::path& metrics) {
  const auto& st = c.strategy;
  const auto& md = c.model;
  std::vector<std::string> a = {
      spec.script, "--tp", std::to_string(st.tp()), "--pp", std::to_string(st.pp()),
      "--zero", std::to_string(st.zero()), "--microbatches", std::to_string(st.microbatches()),
      "--steps", std::to_string(spec.matrix.steps()), "--batch", std::to_string(c.batch_per_dp),
      "--seq", std::to_string(md.seq()), "--dim", std::to_string(md.dim()), "--heads",
      std::to_string(md.heads()), "--layers", std::to_string(md.layers()), "--vocab",
      std::to_string(md.vocab()), "--metrics-out", metrics.string()};
  if (st.sp()) a.push_back("--sp");
  if (c.compile) a.push_back("--compile");
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

// Runs one cell; returns its figures with "status" and, on failure, "error".
Figures RunCell(const MatrixSpec& spec, const MatrixCell& c, const fs::path& dir,
                const std::string& neuronrun) {
  fs::create_directories(dir);
  const fs::path log = dir / "output.log", metrics = dir / "metrics.txt";
  fs::remove(log);
  fs::remove(metrics);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> common;
  if (!c.topology.empty()) common = {"--topology", c.topology};
  std::vector<pid_t> agents;
  std::vector<std::string> env;
  if (c.nodes == 1) {
    std::vector<std::string> argv = {neuronrun, "-n", std::to_string(c.ranks_per_node)};
    argv.insert(argv.end(), common.begin(), common.end());
    for (auto& a : TrainerArgs(spec, c, metrics)) argv.push_back(a);
    agents.push_back(Start(argv, log, env));
  } else {  // one agent per simulated node, rendezvous on this machine
    const std::string endpoint = "127.0.0.1:" + std::to_string(PickFreePort());
    env.push_back("NEURON_RDZV_SECRET=" + collectives::auth::GenerateSecret());
    for (int node = 0; node < c.nodes; ++node) {
      std::vector<std::string> argv = {neuronrun, "--nnodes", std::to_string(c.nodes),
                                       "--node-rank", std::to_string(node), "--rdzv-endpoint",
                                       endpoint, "-n", std::to_string(c.ranks_per_node)};
      argv.insert(argv.end(), common.begin(), common.end());
      for (auto& a : TrainerArgs(spec, c, metrics)) argv.push_back(a);
      agents.push_back(Start(argv, log, env));
    }
  }
  int failed = 0;
  for (pid_t pid : agents) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  Figures f = ReadFigures(metrics);
  f["wall_s"] = std::to_string(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (failed == 0 && f.count("loss")) {
    f["status"] = "completed";
  } else {
    f["status"] = "failed";
    f["error"] = ErrorOf(log);
  }
  return f;
}

double Number(const Figures& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() || it->second.empty() ? std::nan("") : std::stod(it->second);
}

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

void WriteReports(const MatrixSpec& spec, const std::vector<Figures>& results,
                  const fs::path& out) {
  const std::vector<int> base = Baselines(spec);
  std::set<std::string> ops;
  for (const auto& f : results) {
    for (const auto& [k, v] : f) {
      if (k.rfind("bytes_per_step_", 0) == 0) ops.insert(k);
    }
  }
  const bool weak = spec.matrix.scaling() == proto::WEAK;
  std::ofstream csv(out / "results.csv");
  csv << "cell,strategy,nodes,ranks_per_node,world,tp,pp,dp,zero,sp,microbatches,model,compile,topology,"
         "status,error,loss,loss_diff,first_step_ms,wall_step_ms,modelled_step_us,compute_us,"
         "exposed_comm_us,bubble_us,wall_tokens_per_s,modelled_tokens_per_s_per_device,"
         "scaling_efficiency,max_rss_mib,model_state_mib";
  for (const auto& op : ops) csv << "," << op;
  csv << "\n";
  std::ostringstream md;
  md << "# Scaling matrix: " << spec.matrix.name() << "\n\n"
     << "Made by `neuronrun matrix " << spec.path << " --out " << out.string() << "`. "
     << "From `" << spec.path << "`: " << spec.cells.size() << " cells, "
     << (weak ? "weak" : "strong") << " scaling (" << spec.matrix.batch() << " sequences "
     << (weak ? "per data-parallel rank" : "per step") << "), " << spec.matrix.steps()
     << " steps each; figures are medians over the steps after the first, the slowest rank's. "
        "Efficiency: modelled tokens/s per device against the cell's baseline (the fewest "
        "ranks with the same strategy and model); loss diff: against the same baseline. Every cell ran as a real job (none modelled).\n\n"
     << "| cell | ranks | tp x pp x dp | ZeRO | status | loss (diff) | wall step ms | modelled "
        "step us (compute / exposed comm / bubble) | modelled tokens/s/device | efficiency | "
        "model-state MiB | max RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<std::string> failures;
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& c = spec.cells[i];
    const Figures& f = results[i];
    const Figures& b = results[base[i]];
    const bool ok = f.count("status") && f.at("status") == "completed";
    const double eff = Number(f, "modelled_tokens_per_s_per_device") /
                       Number(b, "modelled_tokens_per_s_per_device");
    const double diff = Number(f, "loss") - Number(b, "loss");
    const std::string error = f.count("error") ? f.at("error") : "";
    csv << Csv(c.id) << "," << Csv(c.strategy.name()) << "," << c.nodes << "," << c.ranks_per_node << "," << c.world() << ","
        << c.strategy.tp() << "," << c.strategy.pp() << "," << c.dp() << ","
        << c.strategy.zero() << "," << (c.strategy.sp() ? 1 : 0) << ","
        << c.strategy.microbatches() << "," << Csv(c.model.name()) << ","
        << (c.compile ? 1 : 0) << "," << Csv(c.topology) << ","
        << (f.count("status") ? f.at("status") : "not run") << "," << Csv(error) << ","
        << Fixed(Number(f, "loss"), 6) << "," << Fixed(diff, 6) << ","
        << Fixed(Number(f, "first_step_ms"), 2) << "," << Fixed(Number(f, "wall_step_ms"), 2)
        << "," << Fixed(Number(f, "modelled_step_us"), 2) << ","
        << Fixed(Number(f, "compute_us"), 2) << "," << Fixed(Number(f, "exposed_comm_us"), 2)
        << "," << Fixed(Number(f, "bubble_us"), 2) << ","
        << Fixed(Number(f, "wall_tokens_per_s"), 1) << ","
        << Fixed(Number(f, "modelled_tokens_per_s_per_device"), 1) << "," << Fixed(eff, 4)
        << "," << Fixed(Number(f, "max_rss_mib"), 1) << ","
        << Fixed(Number(f, "model_state_mib"), 3);
    for (const auto& op : ops) csv << "," << Fixed(Number(f, op), 0);
    csv << "\n";
    md << "| " << c.id << " | " << c.world() << " | " << c.strategy.tp() << " x "
       << c.strategy.pp() << " x " << c.dp() << " | " << c.strategy.zero() << " | "
       << (ok ? "completed" : "**failed**") << " | " << Fixed(Number(f, "loss"), 4) << " ("
       << Fixed(diff, 4) << ") | " << Fixed(Number(f, "wall_step_ms"), 1) << " | "
       << Fixed(Number(f, "modelled_step_us"), 1) << " (" << Fixed(Number(f, "compute_us"), 1)
       << " / " << Fixed(Number(f, "exposed_comm_us"), 1) << " / "
       << Fixed(Number(f, "bubble_us"), 1) << ") | "
       << Fixed(Number(f, "modelled_tokens_per_s_per_device"), 0) << " | " << Fixed(eff, 3)
       << " | " << Fixed(Number(f, "model_state_mib"), 2) << " | "
       << Fixed(Number(f, "max_rss_mib"), 0) << " |\n";
    if (!ok) failures.push_back(c.id + ": " + error);
  }
  md << "\n![scaling efficiency](efficiency.png)\n\n![modelled step time breakdown]"
        "(breakdown.png)\n\n![memory per rank](memory.png)\n";
  if (!failures.empty()) {
    md << "\n## Failed cells\n\n";
    for (const auto& f : failures) md << "- " << f << "\n";
  }
  std::ofstream(out / "report.md") << md.str();
}

}  // namespace

int RunMatrix(const MatrixSpec& spec, const std::string& out_dir, const std::string& neuronrun,
              const std::vector<std::string>& plotter, std::ostream& progress) {
  const fs::path out(out_dir);
  fs::create_directories(out / "cells");
  std::vector<Figures> results(spec.cells.size());
  int done = 0, failed = 0, skipped = 0;
  const int total = static_cast<int>(spec.cells.size());
  for (int i = 0; i < total; ++i) {
    const MatrixCell& c = spec.cells[i];
    const fs::path dir = out / "cells" / c.id;
    const fs::path result = dir / "result.txt";
    Figures f = ReadFigures(result);
    if (f.count("status") && f["status"] == "completed") {
      ++skipped;
    } else {
      progress << "[matrix " << spec.matrix.name() << "] running " << c.id << " (" << (i + 1)
               << "/" << total << ": done " << done + skipped << ", failed " << failed
               << ", left " << total - i << ")" << std::endl;
      f = RunCell(spec, c, dir, neuronrun);
      WriteFigures(result, f);
    }
    if (f["status"] == "completed") {
      ++done;
    } else {
      ++failed;
      progress << "[matrix " << spec.matrix.name() << "] cell " << c.id
               << " failed: " << f["error"] << std::endl;
    }
    results[i] = f;
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
           << " completed (" << skipped << " from an earlier run), " << failed << " failed; "
           << (out / "results.csv").string() << ", " << (out / "report.md").string()
           << std::endl;
  return failed == 0 ? 0 : 1;
}

}  // namespace neuron::launcher
