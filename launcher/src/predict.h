// `neuronrun predict`: a full-size training step predicted on a Trainium
// cluster without running it (docs/scaling.md, "Predicting a full-size
// job"). The step's operations are captured with their real shapes on fake
// tensors (python -m torchneuron.predict), priced by the device model
// (parallel::PriceStep), laid out as the job's ranks run them
// (parallel::PredictedTraces) and composed over the whole cluster by the
// trace replay (runtime::ReplayTraces) on the topology's fabric model.
//
// Usage:
//   PredictOptions o;  o.model_file = "configs/models/llama2-7b.textproto"; ...
//   Prediction p = Predict(o);
//   PrintPrediction(p, std::cout);
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "neuron/parallel/decoder_model.h"
#include "neuron/parallel/step_capture.pb.h"
#include "neuron/parallel/step_memory.h"
#include "neuron/parallel/step_pricing.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/topology.h"

namespace neuron::launcher {

struct PredictOptions {
  std::string model_file;
  int seq = 0, micro_batch = 1, global_batch = 0;
  int tp = 1, pp = 1, dp = 0;  // dp 0: the world over tp x pp
  int ep = 1;                  // expert parallel, carved out of dp (a Mixture of Experts)
  double capacity_factor = 0;  // 0: the model file's (else 1.0)
  int zero = 0;
  bool sequence_parallel = false;
  std::string checkpointing = "none";  // none | selective | full
  bool recompute_mlp = false;
  std::string attention = "flash";     // flash | core
  std::string dtype = "bf16-mixed";    // bf16-mixed | bf16 | fp32
  std::string topology_file;           // "" : the embedded trn2 node
  int nodes = 0;                       // 0: as many as tp x pp x dp fill, else 1
  int ranks_per_node = 0;              // 0: the topology's chips x ranks per chip
  std::string device_file;             // "" : NEURON_DEVICE_FILE or the embedded v3
  parallel::PricingOptions pricing;    // matmul_overhead_cycles < 0: the calibration's
  std::string calibration_file;        // "" : configs/predict/calibration.textproto
  std::string python;                  // "" : NEURON_PYTHON's
  std::string capture_file;            // a capture to price (no Python run)
  std::string capture_out;             // keep the capture here
};

struct Breakdown {
  double compute_us = 0;               // the operations, per engine below
  std::map<std::string, double> engine_us;
  double tp_comm_us = 0;               // blocking tensor-parallel collectives
  double ep_comm_us = 0;               // blocking expert-parallel all-to-alls
  double dp_comm_us = 0;               // exposed data-parallel collectives
  double pipeline_messages_us = 0;     // pipeline messages' transfers a stage waits for
  double bubble_us = 0;                // the rest of its wait on messages: the bubble
  double optimizer_us = 0;             // the optimizer update (in compute)
};

struct Prediction {
  PredictOptions options;
  parallel::proto::DecoderModel model;
  int world = 0, dp = 0, microbatches = 0;
  double step_us = 0;
  Breakdown breakdown;
  double seq_per_s = 0, tokens_per_s = 0, mfu = 0;
  double model_parameters = 0;
  double active_parameters = 0;               // per token (a Mixture of Experts: top-k's)
  std::vector<parallel::StepMemory> memory;  // per pipeline stage
  double hbm_capacity = 0;                    // bytes per NeuronCore
  double replay_s = 0;                        // wall time of the replay
  double matmul_overhead_cycles = 0;          // as priced
  std::string calibration_source;             // where that figure comes from
  bool fits() const;
};

// InvalidUsage names what is wrong with the model file or the layout (tp
// not dividing heads, pp above the layers, a global batch the layout does
// not divide, more ranks than the nodes hold, ep not dividing the experts
// or dp, ...); IoError says why the capture failed.
Prediction Predict(const PredictOptions& options);

// Predict in three steps, so that several predictions share one capture
// process (a prediction table): Prepare checks the model and the layout
// (InvalidUsage as Predict); CaptureArgs are python -m torchneuron.predict's
// arguments for it, writing `out`; RunCaptures runs one such Python
// (`python`: "" for NEURON_PYTHON's) for several argument lists, each
// capture that is refused leaving `out`.error with the reason; Complete
// prices, lays out and replays a capture.
struct PreparedPrediction {
  Prediction prediction;    // its options, model, world, dp, microbatches
  std::vector<int> stages;  // decoder layers per pipeline stage
  std::optional<runtime::Topology> topology;  // the node, read once
  int ranks_per_node = 0;
  std::optional<runtime::DeviceSpec> device;  // the NeuronCore, read once
};
PreparedPrediction Prepare(const PredictOptions& options);
std::vector<std::string> CaptureArgs(const PreparedPrediction& prepared, const std::string& out);
void RunCaptures(const std::string& python, const std::vector<std::vector<std::string>>& args);
Prediction Complete(const PreparedPrediction& prepared,
                    const parallel::proto::StepCapture& capture);
parallel::proto::StepCapture LoadCapture(const std::string& path);

void PrintPrediction(const Prediction& p, std::ostream& out);

// neuronrun predict [flags]: 0, or 2 for bad input or a layout that does
// not fit HBM (its numbers printed).
int PredictMain(int argc, char** argv);

}  // namespace neuron::launcher
