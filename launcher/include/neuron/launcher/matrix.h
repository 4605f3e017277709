// The scaling test matrix (`neuronrun matrix FILE [--out DIR]`,
// docs/scaling.md): a grid of layouts and model sizes from a text protobuf
// file (launcher/proto/neuron/launcher/matrix.proto), each cell run as a
// real neuronrun job of a few training steps, results gathered into a CSV
// and a Markdown report.
//
//   MatrixSpec spec = LoadMatrix("configs/scaling/smoke.textproto");  // validated
//   int status = RunMatrix(spec, "out/smoke", "/path/to/neuronrun", plotter, std::cout);
#pragma once

#include <ostream>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "neuron/launcher/matrix.pb.h"

namespace neuron::launcher {

struct MatrixCell {
  std::string id;  // unique, file-name safe: "n1x4-tp2-pp1-z0-small-eager-default"
  int nodes = 1;
  int ranks_per_node = 1;
  proto::Strategy strategy;
  proto::Model model;
  bool compile = false;
  std::string topology;  // a file, or "" for the embedded trn2 node
  int world() const { return nodes * ranks_per_node; }
  int dp() const { return world() / (strategy.tp() * strategy.pp()); }
  // Data-parallel replicas: dp over the expert-parallel ranks carved out of it.
  int replicas() const { return dp() / std::max(1, strategy.ep()); }
  int batch_per_dp = 8;  // sequences per data-parallel rank per step
  // Modelled (more ranks than max_real_ranks): replays the trace of the
  // real cell `source` (an index into MatrixSpec::cells), scaled to this
  // cell's tp with the trace of the real cell `tp_source` when that is set
  // (runtime/fabric/trace_scaling.h), and to this cell's pp when the
  // source's is smaller (parallel/pipeline_trace_scaling.h).
  bool modelled = false;
  int source = -1;
  int tp_source = -1;
};

struct MatrixSpec {
  std::string path;
  std::string script;  // absolute
  proto::ScalingMatrix matrix;  // defaults filled in
  std::vector<MatrixCell> cells;
};

// Parses and validates `path` before anything runs: an unknown field, an
// impossible layout (tp x pp not dividing the ranks, tp not dividing the
// heads, a batch data parallel does not divide), a missing topology file
// or trainer throw InvalidUsage naming the file, line and field.
MatrixSpec LoadMatrix(const std::string& path);

// The real cell whose trace replays `cell`: among the real cells of fewer
// than `below` ranks with the same strategy, model, compile mode and
// per-rank batch, and at least 2 data-parallel ranks, the one on the same
// topology if any, then the largest. -1 when there is none.
int RecordingFor(const MatrixSpec& spec, const MatrixCell& cell, int below);

// Two real cells at two tp sizes whose traces scale to `cell`'s tp
// (runtime::ScaleTensorParallel): among the real cells other than `cell` of
// at most `up_to` ranks whose strategy differs from `cell`'s only in name
// and tp (tp >= 2: the trainer's tp = 1 program has no tensor-parallel
// collectives), with the same model, compile mode and per-rank batch, per
// tp the one with at least 2 data-parallel ranks if any, then on the same
// topology, then the largest; of those the one at `cell`'s own tp (a
// recording of one replica) or else the largest tp below it, and the one
// at the largest other tp (preferring the first's dp). {-1, -1} when there is no such
// pair (no tp at or below `cell`'s: scaling down is refused).
std::pair<int, int> TpRecordingsFor(const MatrixSpec& spec, const MatrixCell& cell,
                                    int up_to);

// A real cell whose trace scales to `cell`'s pp (parallel::ScalePipeline):
// among the real cells other than `cell` of at most `up_to` ranks whose
// strategy differs from `cell`'s only in name and pp, at a pp of at least 2
// (a pipeline recording) and below `cell`'s, without ZeRO (its wrapped
// chunks record no pipeline plan) or sequence parallelism (its per-stage
// gradient all-reduce is not resized), with the same model, compile mode and
// per-rank batch: the one with at least 2 data-parallel ranks if any, then
// on the same topology, then the largest pp, then the largest. -1 when
// there is none.
int PpRecordingFor(const MatrixSpec& spec, const MatrixCell& cell, int up_to);

// What `cell` is replayed from ({source, tp_source}, docs/scaling.md): the
// recording of its own strategy (RecordingFor, fewer ranks), else two at
// other tp sizes (TpRecordingsFor), else one at a smaller pp
// (PpRecordingFor), each of at most `cell`'s ranks; {-1, -1} when there is
// none.
std::pair<int, int> ReplaySources(const MatrixSpec& spec, const MatrixCell& cell);

// Runs every cell that has no result in `out_dir` yet (a rerun skips
// finished cells), one at a time, printing a progress line per cell; a
// failing cell is recorded with its error and the matrix goes on. Then
// writes out_dir/results.csv and out_dir/report.md over all cells, and runs
// `plotter` (argv; the CSV and out_dir are appended; empty: none) for the
// PNG plots. Returns 0 when every cell completed and the plots were made, 1
// otherwise.
int RunMatrix(const MatrixSpec& spec, const std::string& out_dir, const std::string& neuronrun,
              const std::vector<std::string>& plotter, std::ostream& progress);

}  // namespace neuron::launcher
