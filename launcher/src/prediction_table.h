// `neuronrun predict --table FILE`: every row of a prediction table
// (launcher/proto/neuron/launcher/prediction_table.proto) predicted, and a
// report that puts each prediction beside its published figure and the
// error (docs/scaling.md, "Predicting a full-size job").
//
// Usage:
//   proto::PredictionTable t = LoadPredictionTable("configs/scaling/published-trn1.textproto");
//   std::vector<TableResult> r = RunPredictionTable(t, {});
//   WriteTableReport(t, r, std::cout);
//   std::vector<std::string> moved = CheckRecordedErrors(t, r, 5.0);
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "neuron/launcher/prediction_table.pb.h"
#include "predict.h"

namespace neuron::launcher {

// Reads and checks a table; each row's model, topology and device files are
// resolved next to the table, here or in the sources. InvalidUsage names the
// file and the row.
proto::PredictionTable LoadPredictionTable(const std::string& path);

// A row as `neuronrun predict` options; `base` gives the rest (python, capture).
PredictOptions RowOptions(const proto::PredictionRow& row, const PredictOptions& base);

struct TableResult {
  Prediction prediction;
  double error_pct = 0;  // predicted / published - 1; 0 for a forecast
  std::string error;     // why the row could not be predicted, if it could not
};

// Predicts every row (one capture each); a row that fails is reported in
// its result, and the table goes on.
std::vector<TableResult> RunPredictionTable(const proto::PredictionTable& table,
                                            const PredictOptions& base);

// A Markdown report: per row the layout, the predicted and published seq/s,
// the error, the step's breakdown and the peak HBM per NeuronCore.
void WriteTableReport(const proto::PredictionTable& table,
                      const std::vector<TableResult>& results, std::ostream& out);

// One line per published row whose error moved more than `points` from its
// recorded_error_pct (or that failed); empty when none did.
std::vector<std::string> CheckRecordedErrors(const proto::PredictionTable& table,
                                             const std::vector<TableResult>& results,
                                             double points);

}  // namespace neuron::launcher
