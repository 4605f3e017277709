// neuronrun predict: flags, help and the printed prediction (predict.h).
#include <iomanip>
#include <iostream>
#include <sstream>

#include "flag_values.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include <filesystem>

#include "predict.h"
#include "prediction_table.h"

namespace neuron::launcher {

namespace {

constexpr int kUsageError = 2;

constexpr const char* kPredictHelp =
    "usage: neuronrun predict --model FILE --seq N --global-batch N [options]\n"
    "       neuronrun predict --table FILE [--out DIR] [--check]\n"
    "Predicts one training step of a full-size decoder on a Trainium cluster without\n"
    "running it: the step's operations are captured with their real shapes on fake\n"
    "tensors (python -m torchneuron.predict), priced by the device model, and composed\n"
    "over every rank by the trace replay on the topology's fabric (docs/scaling.md,\n"
    "\"Predicting a full-size job\"). Prints where the step goes, a line 'seq/s: N',\n"
    "tokens/s, MFU and the peak HBM per NeuronCore by what it holds.\n"
    "  --model FILE                 a decoder (configs/models/*.textproto)\n"
    "  --seq N                      sequence length\n"
    "  --micro-batch N              sequences per microbatch (default 1)\n"
    "  --global-batch N             sequences per step, over every replica\n"
    "  --tp N, --pp N               tensor- and pipeline-parallel sizes (default 1)\n"
    "  --dp N                       data-parallel size (default: the ranks over tp x pp;\n"
    "                               given, it must be that)\n"
    "  --ep N                       expert parallel (a Mixture of Experts' model file):\n"
    "                               ep consecutive data-parallel ranks hold experts / ep\n"
    "                               each and exchange tokens by all-to-all; divides dp\n"
    "                               and the experts (default 1)\n"
    "  --capacity-factor F          tokens an expert takes: F x tokens x top_k / experts\n"
    "                               of a rank's (default: the model file's, else 1.0)\n"
    "  --zero N                     ZeRO stage 0-3 (default 0)\n"
    "  --sequence-parallel          split activations along the sequence outside the\n"
    "                               tensor-parallel regions\n"
    "  --activation-checkpointing M none | selective | full (default none)\n"
    "  --recompute-mlp              selective checkpointing recomputes the whole MLP\n"
    "  --attention A                flash (one kernel, default) | core (scores in memory)\n"
    "  --dtype D                    bf16-mixed (bf16 compute, fp32 master weights and\n"
    "                               gradient accumulation, as NxD trains; default) |\n"
    "                               bf16 (pure bf16) | fp32\n"
    "  --topology FILE              the node (default: the embedded trn2 node)\n"
    "  --nodes N                    nodes (default: as many as tp x pp x --dp ranks\n"
    "                               fill, else 1)\n"
    "  --ranks-per-node N           default: the node's chips x ranks per chip\n"
    "  --device FILE                the NeuronCore (default: NEURON_DEVICE_FILE or the\n"
    "                               embedded NeuronCore-v3)\n"
    "  --pricing P                  compiled (default) | eager: how each op is priced\n"
    "  --matmul-overhead-cycles C   compiled pricing's cycles per matmul instruction\n"
    "                               beyond its issue interval (default: the device's in\n"
    "                               the calibration file)\n"
    "  --calibration FILE           fitted constants per device (default:\n"
    "                               configs/predict/calibration.textproto)\n"
    "  --python PATH                the Python that captures (default NEURON_PYTHON)\n"
    "  --capture FILE               price this capture instead of capturing\n"
    "  --capture-out FILE           keep the capture\n"
    "  --table FILE                 predict every row of a prediction table\n"
    "                               (configs/scaling/published-trn1.textproto) and print a\n"
    "                               report: prediction, published figure, error\n"
    "  --out DIR                    with --table: also write DIR/report.md\n"
    "  --check                      with --table: exit 1 when a published row's error\n"
    "                               moved more than 5 points from its recorded_error_pct\n"
    "Exit status: 0; 2 for a bad model file, layout or table, or a layout that does not\n"
    "fit HBM (the numbers that do not fit are printed); 1 for a failed --check.\n";

// Seconds from 1 s, else milliseconds, to the microsecond.
std::string Seconds(double us) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << (us >= 1e6 ? us * 1e-6 : us * 1e-3)
    << (us >= 1e6 ? " s" : " ms");
  return s.str();
}

std::string GiB(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << bytes / (1ull << 30) << " GiB";
  return s.str();
}

struct TableFlags {
  std::string table, out;
  bool check = false;
};

// The command line, one flag at a time; each flag names itself in errors.
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool Next() { return ++i_ < argc_; }
  std::string flag() const { return argv_[i_]; }
  std::string Text() {
    NEURON_CHECK(i_ + 1 < argc_, flag(), " needs a value");
    return argv_[++i_];
  }
  int Number(std::uint64_t min, std::uint64_t max) {
    const std::string f = flag();
    return static_cast<int>(ParseUnsigned(f, Text(), min, max));
  }

 private:
  int argc_;
  char** argv_;
  int i_ = -1;
};

// The model and the layout's flags; false for another flag.
bool ParseLayoutFlag(Args& a, PredictOptions& o) {
  const std::string f = a.flag();
  if (f == "--model") o.model_file = a.Text();
  else if (f == "--seq") o.seq = a.Number(1, 1 << 22);
  else if (f == "--micro-batch") o.micro_batch = a.Number(1, 1 << 20);
  else if (f == "--global-batch") o.global_batch = a.Number(1, 1 << 26);
  else if (f == "--tp") o.tp = a.Number(1, 65536);
  else if (f == "--pp") o.pp = a.Number(1, 65536);
  else if (f == "--dp") o.dp = a.Number(1, 65536);
  else if (f == "--ep") o.ep = a.Number(1, 65536);
  else if (f == "--capacity-factor") o.capacity_factor = ParseFinite(f, a.Text(), 0, 64);
  else if (f == "--zero") o.zero = a.Number(0, 3);
  else if (f == "--sequence-parallel") o.sequence_parallel = true;
  else if (f == "--activation-checkpointing") o.checkpointing = a.Text();
  else if (f == "--recompute-mlp") o.recompute_mlp = true;
  else if (f == "--attention") o.attention = a.Text();
  else if (f == "--dtype") o.dtype = a.Text();
  else return false;
  return true;
}

// The cluster's, the pricing's and the run's flags; false for another flag.
bool ParseRunFlag(Args& a, PredictOptions& o, TableFlags& t) {
  const std::string f = a.flag();
  if (f == "--topology") o.topology_file = a.Text();
  else if (f == "--nodes") o.nodes = a.Number(1, 4096);  // 0 (unset): see ResolveCluster
  else if (f == "--ranks-per-node") o.ranks_per_node = a.Number(1, 65536);
  else if (f == "--device") o.device_file = a.Text();
  else if (f == "--pricing") o.pricing.pricing = parallel::ParsePricing(a.Text());
  else if (f == "--matmul-overhead-cycles")
    o.pricing.matmul_overhead_cycles = ParseFinite(f, a.Text(), 0, 1e6);
  else if (f == "--calibration") o.calibration_file = a.Text();
  else if (f == "--python") o.python = a.Text();
  else if (f == "--capture") o.capture_file = a.Text();
  else if (f == "--capture-out") o.capture_out = a.Text();
  else if (f == "--table") t.table = a.Text();
  else if (f == "--out") t.out = a.Text();
  else if (f == "--check") t.check = true;
  else return false;
  return true;
}

PredictOptions ParsePredict(int argc, char** argv, bool* help, TableFlags* table) {
  PredictOptions o;
  o.pricing.matmul_overhead_cycles = -1;  // the calibration file's
  Args a(argc, argv);
  while (a.Next()) {
    if (a.flag() == "-h" || a.flag() == "--help") {
      *help = true;
    } else if (!ParseLayoutFlag(a, o) && !ParseRunFlag(a, o, *table)) {
      throw InvalidUsage(StrCat("unexpected argument '", a.flag(), "'"));
    }
  }
  if (*help) return o;
  NEURON_CHECK(table->table.empty() || o.model_file.empty(), "--table and --model exclude one "
               "another");
  NEURON_CHECK(!table->table.empty() || (table->out.empty() && !table->check),
               "--out and --check go with --table");
  if (!table->table.empty()) return o;
  NEURON_CHECK(!o.model_file.empty(), "--model is required");
  NEURON_CHECK(o.seq > 0, "--seq is required");
  NEURON_CHECK(o.global_batch > 0, "--global-batch is required");
  return o;
}

void PrintMemory(const Prediction& p, std::ostream& out) {
  int fullest = 0;
  for (int s = 0; s < static_cast<int>(p.memory.size()); ++s) {
    if (p.memory[s].total() > p.memory[fullest].total()) fullest = s;
  }
  const parallel::StepMemory& m = p.memory[static_cast<std::size_t>(fullest)];
  out << "HBM per NeuronCore (peak, stage " << fullest << " of " << p.memory.size()
      << "), of " << GiB(p.hbm_capacity) << ":\n"
      << "  weights and optimizer state  " << GiB(m.weights_and_optimizer) << "\n"
      << "  activations                  " << GiB(m.activations) << "\n"
      << "  gradients                    " << GiB(m.gradients) << "\n"
      << "  communication buffers        " << GiB(m.communication) << "\n"
      << "  total                        " << GiB(m.total())
      << (p.fits() ? "" : "  DOES NOT FIT") << "\n";
}

}  // namespace

void PrintPrediction(const Prediction& p, std::ostream& out) {
  const PredictOptions& o = p.options;
  const Breakdown& b = p.breakdown;
  out << "predict: " << p.model.name() << " (" << std::setprecision(3)
      << p.model_parameters / 1e9 << "B parameters";
  if (p.model.experts() > 0) {
    out << ", " << p.active_parameters / 1e9 << "B active: top-" << p.model.top_k() << " of "
        << p.model.experts() << " experts";
  }
  out << "), " << p.world << " ranks: tp " << o.tp << " x pp " << o.pp << " x dp " << p.dp;
  if (p.model.experts() > 0) out << " (ep " << o.ep << " of dp)";
  out << ", ZeRO-" << o.zero << ", seq " << o.seq
      << ", micro-batch " << o.micro_batch << ", global batch " << o.global_batch << " ("
      << p.microbatches << " microbatches per replica), " << o.dtype << ", "
      << parallel::Name(o.pricing.pricing) << " (matmul overhead " << p.matmul_overhead_cycles
      << " cycles: " << p.calibration_source << ")\n";
  out << "step: " << Seconds(p.step_us) << "\n";
  out << "  compute                      " << Seconds(b.compute_us) << " (";
  bool first = true;
  for (const auto& [engine, us] : b.engine_us) {
    out << (first ? "" : ", ") << engine << " " << Seconds(us);
    first = false;
  }
  out << ")\n"
      << "  tensor-parallel comm         " << Seconds(b.tp_comm_us) << "\n";
  if (p.model.experts() > 0) {
    out << "  expert-parallel all-to-all   " << Seconds(b.ep_comm_us) << "\n";
  }
  out << "  optimizer                    " << Seconds(b.optimizer_us) << "\n"
      << "  data-parallel comm (exposed) " << Seconds(b.dp_comm_us) << "\n"
      << "  pipeline comm (exposed)      " << Seconds(b.pipeline_messages_us) << "\n"
      << "  pipeline bubble              " << Seconds(b.bubble_us) << "\n";
  out << std::fixed << std::setprecision(2) << "seq/s: " << p.seq_per_s << "\n"
      << "tokens/s: " << std::setprecision(0) << p.tokens_per_s << "\n"
      << "MFU: " << std::setprecision(1) << p.mfu * 100
      << "% (model FLOPs: 3 x forward, attention in full"
      << (p.model.experts() > 0 ? ", the router and top-k experts" : "") << ")\n";
  out.unsetf(std::ios::fixed);
  PrintMemory(p, out);
  out << "replayed " << p.world << " ranks in " << std::fixed << std::setprecision(2)
      << p.replay_s << " s\n";
  out.unsetf(std::ios::fixed);
}

// --table: every row, the report on stdout (and DIR/report.md), --check.
int TableMain(const PredictOptions& base, const TableFlags& flags) {
  const proto::PredictionTable table = LoadPredictionTable(flags.table);
  const std::vector<TableResult> results = RunPredictionTable(table, base);
  WriteTableReport(table, results, std::cout);
  if (!flags.out.empty()) {
    std::filesystem::create_directories(flags.out);
    const std::string path = (std::filesystem::path(flags.out) / "report.md").string();
    std::ostringstream report;
    WriteTableReport(table, results, report);
    runtime::WriteFileAtomically(path, report.str());  // never through a planted link
  }
  if (!flags.check) return 0;
  const auto moved = CheckRecordedErrors(table, results, 5.0);
  for (const auto& line : moved) std::cerr << "neuronrun predict: check: " << line << "\n";
  return moved.empty() ? 0 : 1;
}

int PredictMain(int argc, char** argv) {
  bool help = false;
  try {
    TableFlags table;
    const PredictOptions o = ParsePredict(argc, argv, &help, &table);
    if (help) {
      std::cout << kPredictHelp;
      return 0;
    }
    if (!table.table.empty()) return TableMain(o, table);
    const Prediction p = Predict(o);
    PrintPrediction(p, std::cout);
    if (!p.fits()) {
      std::cerr << "neuronrun predict: error: the layout does not fit the "
                << GiB(p.hbm_capacity) << " of HBM per NeuronCore (above)\n";
      return kUsageError;
    }
    return 0;
  } catch (const InvalidUsage& e) {
    std::cerr << "neuronrun predict: error: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "neuronrun predict: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace neuron::launcher
