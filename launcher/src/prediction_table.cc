#include "prediction_table.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <iomanip>
#include <sstream>

#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"
#include "source_path.h"
#include "temp_dir.h"

namespace neuron::launcher {

namespace fs = std::filesystem;

namespace {

std::string Fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string Layout(const proto::PredictionRow& r, const Prediction& p) {
  std::ostringstream s;
  if (r.nodes() > 0) s << r.nodes() << " nodes, ";
  s << p.world << " ranks: tp " << std::max(1, r.tp()) << " x pp " << std::max(1, r.pp())
    << " x dp " << p.dp << (r.ep() > 1 ? " (ep " + std::to_string(r.ep()) + ")" : "")
    << (r.zero() ? ", ZeRO-" + std::to_string(r.zero()) : "")
    << (r.sequence_parallel() ? ", SP" : "") << ", seq " << r.seq() << ", gbs "
    << r.global_batch();
  return s.str();
}

// A row's prediction from its capture (or the reason its capture refused it).
void Finish(const proto::PredictionRow& row, const PreparedPrediction& prepared,
            const std::string& capture, TableResult& r) {
  const std::string refused = capture + ".error";
  if (fs::exists(refused)) {
    r.error = runtime::ReadTextFile(refused, "capture error");
    return;
  }
  try {
    r.prediction = Complete(prepared, LoadCapture(capture));
    if (row.published_seq_per_s() > 0) {
      r.error_pct = (r.prediction.seq_per_s / row.published_seq_per_s() - 1) * 100;
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
}

}  // namespace

proto::PredictionTable LoadPredictionTable(const std::string& path) {
  proto::PredictionTable table;
  runtime::ParseTextProto(runtime::ReadTextFile(path, "prediction table"), path,
                          "prediction table", &table);
  NEURON_CHECK(table.rows_size() > 0, path, ": no rows");
  int fitted = 0;
  for (auto& row : *table.mutable_rows()) {
    const std::string where = StrCat(path, ": row \"", row.name(), "\"");
    NEURON_CHECK(!row.model().empty() && row.seq() > 0 && row.global_batch() > 0, where,
                 ": model, seq and global_batch are required");
    NEURON_CHECK(row.published_seq_per_s() >= 0 && std::isfinite(row.published_seq_per_s()),
                 where, ": published_seq_per_s must be >= 0");
    row.set_model(ResolveNear(row.model(), path).string());
    if (!row.topology().empty()) row.set_topology(ResolveNear(row.topology(), path).string());
    if (!row.device().empty()) row.set_device(ResolveNear(row.device(), path).string());
    fitted += row.fitted();
  }
  NEURON_CHECK(fitted <= 1, path, ": ", fitted, " rows are marked fitted; at most one may be");
  return table;
}

PredictOptions RowOptions(const proto::PredictionRow& row, const PredictOptions& base) {
  PredictOptions o = base;
  o.model_file = row.model();
  o.seq = row.seq();
  o.micro_batch = std::max(1, row.micro_batch());
  o.global_batch = row.global_batch();
  o.tp = std::max(1, row.tp());
  o.pp = std::max(1, row.pp());
  o.ep = std::max(1, row.ep());
  o.zero = row.zero();
  o.sequence_parallel = row.sequence_parallel();
  o.checkpointing = row.checkpointing().empty() ? "none" : row.checkpointing();
  o.recompute_mlp = row.recompute_mlp();
  o.attention = row.attention().empty() ? "flash" : row.attention();
  o.dtype = row.dtype().empty() ? "bf16-mixed" : row.dtype();
  o.topology_file = row.topology();
  o.nodes = row.nodes();  // 0: one node
  o.device_file = row.device();
  return o;
}

std::vector<TableResult> RunPredictionTable(const proto::PredictionTable& table,
                                            const PredictOptions& base) {
  const std::size_t n = static_cast<std::size_t>(table.rows_size());
  std::vector<TableResult> results(n);
  std::vector<std::optional<PreparedPrediction>> prepared(n);
  const TempDir dir("neuron-table");
  auto out = [&dir](std::size_t i) {
    return (dir.path() / (std::to_string(i) + ".textproto")).string();
  };
  std::vector<std::vector<std::string>> args;
  for (std::size_t i = 0; i < n; ++i) {  // every row checked before anything is captured
    try {
      prepared[i] = Prepare(RowOptions(table.rows(static_cast<int>(i)), base));
      args.push_back(CaptureArgs(*prepared[i], out(i)));
    } catch (const std::exception& e) {
      results[i].error = e.what();
    }
  }
  if (!args.empty()) RunCaptures(base.python, args);  // one Python for every row
  for (std::size_t i = 0; i < n; ++i) {
    if (prepared[i]) Finish(table.rows(static_cast<int>(i)), *prepared[i], out(i), results[i]);
  }
  return results;
}

void WriteTableReport(const proto::PredictionTable& table,
                      const std::vector<TableResult>& results, std::ostream& out) {
  out << "# " << table.name() << "\n\n" << table.description() << "\n\n"
      << "| row | layout | predicted seq/s | published seq/s | error | role | step | compute "
         "| TP comm | DP comm (exposed) | PP comm (exposed) | bubble | HBM peak / core | MFU |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (int i = 0; i < table.rows_size(); ++i) {
    const auto& row = table.rows(i);
    const TableResult& r = results[static_cast<std::size_t>(i)];
    if (!r.error.empty()) {
      out << "| " << row.name() << " | | failed: " << r.error << " | | | | | | | | | | | |\n";
      continue;
    }
    const Prediction& p = r.prediction;
    double peak = 0;
    for (const auto& m : p.memory) peak = std::max(peak, m.total());
    const bool published = row.published_seq_per_s() > 0;
    out << "| " << row.name() << " | " << Layout(row, p) << " | " << Fixed(p.seq_per_s, 2)
        << " | " << (published ? Fixed(row.published_seq_per_s(), 2) : "-") << " | "
        << (published ? (r.error_pct >= 0 ? "+" : "") + Fixed(r.error_pct, 1) + "%" : "-")
        << " | " << (row.fitted() ? "fitted" : published ? "held out" : "forecast") << " | "
        << Fixed(p.step_us * 1e-6, 2) << " s | " << Fixed(p.breakdown.compute_us * 1e-6, 2)
        << " s | " << Fixed(p.breakdown.tp_comm_us * 1e-6, 2) << " s"
        << (p.breakdown.ep_comm_us > 0
                ? " (+ " + Fixed(p.breakdown.ep_comm_us * 1e-6, 2) + " s EP all-to-all)"
                : "")
        << " | "
        << Fixed(p.breakdown.dp_comm_us * 1e-6, 2) << " s | "
        << Fixed(p.breakdown.pipeline_messages_us * 1e-6, 2) << " s | "
        << Fixed(p.breakdown.bubble_us * 1e-6, 2) << " s | "
        << Fixed(peak / (1ull << 30), 1) << " GiB" << (p.fits() ? "" : " (does not fit)")
        << " | " << Fixed(p.mfu * 100, 1) << "% |\n";
  }
  out << "\n";
  for (const auto& row : table.rows()) {
    if (!row.source().empty() || !row.note().empty()) {
      out << "- **" << row.name() << "**: " << row.source()
          << (row.note().empty() ? "" : ". " + row.note()) << "\n";
    }
  }
}

std::vector<std::string> CheckRecordedErrors(const proto::PredictionTable& table,
                                             const std::vector<TableResult>& results,
                                             double points) {
  std::vector<std::string> moved;
  for (int i = 0; i < table.rows_size(); ++i) {
    const auto& row = table.rows(i);
    const TableResult& r = results[static_cast<std::size_t>(i)];
    if (!r.error.empty()) {
      moved.push_back(StrCat(row.name(), ": failed: ", r.error));
    } else if (row.published_seq_per_s() > 0 &&
               std::abs(r.error_pct - row.recorded_error_pct()) > points) {
      moved.push_back(StrCat(row.name(), ": error ", Fixed(r.error_pct, 1), "% against ",
                             Fixed(row.recorded_error_pct(), 1), "% recorded (more than ",
                             points, " points)"));
    }
  }
  return moved;
}

}  // namespace neuron::launcher
