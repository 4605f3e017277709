// A decoder-only transformer's architecture (configs/models/*.textproto,
// parallel/proto/neuron/parallel/decoder_model.proto) and what a training
// layout needs of it: its checks, its parameter count, and the split of
// its layers over pipeline stages.
//
// Usage:
//   proto::DecoderModel model = LoadDecoderModel("configs/models/llama2-7b.textproto");
//   CheckDecoderModel(model, "llama2-7b.textproto");
//   double n = DecoderParameters(model);             // 6.74e9
//   std::vector<int> layers = StageLayers(model, 8); // {5, 5, ...} for 40 layers
#pragma once

#include <string>
#include <vector>

#include "neuron/parallel/decoder_model.pb.h"

namespace neuron::parallel {

// Reads and checks a model file (bounded, runtime::ReadTextFile); InvalidUsage
// names the file, and the line of a parse error or the field that is wrong.
proto::DecoderModel LoadDecoderModel(const std::string& path);

// InvalidUsage "<origin>: <field> ..." for a field out of range: sizes < 1 or
// absurd (more than 4096 layers, 1M hidden, 1M heads, 64M vocabulary), heads
// not dividing hidden, kv_heads not dividing heads, an unknown activation,
// norm or position embedding; for a Mixture of Experts, experts above 4096,
// top_k outside 1..experts, a capacity_factor negative or above 64, and
// top_k or capacity_factor without experts.
void CheckDecoderModel(const proto::DecoderModel& model, const std::string& origin);

// Every parameter of the model, unsplit: embeddings, layers (attention,
// MLP, norms, biases for GELU models), final norm and (untied) LM head. A
// Mixture of Experts counts every expert and the router's gate.
double DecoderParameters(const proto::DecoderModel& model);

// The parameters one token computes with: a Mixture of Experts' top_k
// experts of each layer (DecoderParameters for a dense decoder).
double ActiveParameters(const proto::DecoderModel& model);

// A Mixture of Experts' capacity factor: the model's, 1.0 when it gives none.
double CapacityFactor(const proto::DecoderModel& model);

// Forward FLOPs of one token's decoder layers and LM head at sequence
// length `seq` (2 per multiply-add; causal attention counted in full, as
// Megatron-LM and Neuron's published MFU count it). A Mixture of Experts
// counts the router and the top_k experts a token runs (not the capacity's
// padding).
double ForwardFlopsPerToken(const proto::DecoderModel& model, int seq);

// Decoder layers per pipeline stage: `layers / pp` each, the remainder one
// each to the first stages (the embedding and the head sit on the first
// and last stage). InvalidUsage when pp exceeds the layers.
std::vector<int> StageLayers(const proto::DecoderModel& model, int pp);

}  // namespace neuron::parallel
