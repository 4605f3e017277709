#include "neuron/parallel/decoder_model.h"

#include <cmath>

#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"

namespace neuron::parallel {

namespace {

void CheckRange(const std::string& origin, const char* field, long long value, long long max) {
  NEURON_CHECK(value >= 1 && value <= max, origin, ": ", field, " must be between 1 and ",
               max, ", got ", value);
}

// A Mixture of Experts' fields: all three, or (a dense decoder) none.
void CheckExperts(const proto::DecoderModel& m, const std::string& origin) {
  if (m.experts() == 0) {
    NEURON_CHECK(m.top_k() == 0 && m.capacity_factor() == 0, origin, ": top_k and "
                 "capacity_factor are a Mixture of Experts' (set experts too)");
    return;
  }
  CheckRange(origin, "experts", m.experts(), 4096);
  NEURON_CHECK(m.top_k() >= 1 && m.top_k() <= m.experts(), origin, ": top_k (", m.top_k(),
               ") must be between 1 and experts (", m.experts(), ")");
  NEURON_CHECK(std::isfinite(m.capacity_factor()) && m.capacity_factor() >= 0 &&
                   m.capacity_factor() <= 64,
               origin, ": capacity_factor must be between 0 (1.0) and 64, got ",
               m.capacity_factor());
}

// One layer's MLP parameters: the dense MLP's (GELU with biases), or
// `experts` experts (without biases, as torchneuron.parallel.moe's) and the
// router's gate.
double MlpParameters(const proto::DecoderModel& m, double experts) {
  const double h = m.hidden(), f = m.ffn_hidden();
  const bool gelu = m.activation() == "gelu";
  if (m.experts() == 0) return gelu ? 2 * h * f + f + h : 3 * h * f;
  return experts * (gelu ? 2 : 3) * h * f + h * m.experts();
}

// The parameters of the decoder with `experts` of a Mixture of Experts'
// experts per layer (ignored for a dense decoder).
double ParametersWith(const proto::DecoderModel& m, double experts) {
  const double h = m.hidden(), v = m.vocab();
  const double head_dim = h / m.heads();
  const double attention = h * h * 2 + 2 * h * m.kv_heads() * head_dim;  // q, o; k, v
  const bool gelu = m.activation() == "gelu";
  const double mlp = MlpParameters(m, experts);
  const double norms = m.norm() == "layernorm" ? 4 * h : 2 * h;
  const double biases = gelu ? h + 2 * m.kv_heads() * head_dim + h : 0;  // qkv, o
  const double layer = attention + mlp + norms + biases;
  const double positions = m.position() == "learned" ? double(m.max_seq()) * h : 0;
  const double head = m.tied_embeddings() ? 0 : v * h;
  const double final_norm = m.norm() == "layernorm" ? 2 * h : h;
  return v * h + positions + m.layers() * layer + final_norm + head;
}

}  // namespace

void CheckDecoderModel(const proto::DecoderModel& m, const std::string& origin) {
  CheckRange(origin, "layers", m.layers(), 4096);
  CheckRange(origin, "hidden", m.hidden(), 1 << 20);
  CheckRange(origin, "heads", m.heads(), 1 << 20);
  CheckRange(origin, "kv_heads", m.kv_heads(), 1 << 20);
  CheckRange(origin, "ffn_hidden", m.ffn_hidden(), 1 << 24);
  CheckRange(origin, "vocab", m.vocab(), 1 << 26);
  NEURON_CHECK(m.max_seq() >= 0 && m.max_seq() <= (1 << 24), origin,
               ": max_seq must be between 0 and 16777216, got ", m.max_seq());
  NEURON_CHECK(m.hidden() % m.heads() == 0, origin, ": heads (", m.heads(),
               ") do not divide hidden (", m.hidden(), ")");
  NEURON_CHECK(m.heads() % m.kv_heads() == 0, origin, ": kv_heads (", m.kv_heads(),
               ") do not divide heads (", m.heads(), ")");
  NEURON_CHECK(m.activation() == "swiglu" || m.activation() == "gelu", origin,
               ": activation must be \"swiglu\" or \"gelu\", got \"", m.activation(), "\"");
  NEURON_CHECK(m.norm() == "rmsnorm" || m.norm() == "layernorm", origin,
               ": norm must be \"rmsnorm\" or \"layernorm\", got \"", m.norm(), "\"");
  NEURON_CHECK(m.position() == "rotary" || m.position() == "learned", origin,
               ": position must be \"rotary\" or \"learned\", got \"", m.position(), "\"");
  NEURON_CHECK(m.rope_theta() >= 0, origin, ": rope_theta must not be negative");
  CheckExperts(m, origin);
}

proto::DecoderModel LoadDecoderModel(const std::string& path) {
  proto::DecoderModel model;
  runtime::ParseTextProto(runtime::ReadTextFile(path, "model"), path, "model", &model);
  CheckDecoderModel(model, path);
  return model;
}

double DecoderParameters(const proto::DecoderModel& m) {
  return ParametersWith(m, m.experts());
}

double ActiveParameters(const proto::DecoderModel& m) {
  return ParametersWith(m, m.top_k());
}

double CapacityFactor(const proto::DecoderModel& m) {
  return m.capacity_factor() > 0 ? m.capacity_factor() : 1.0;
}

double ForwardFlopsPerToken(const proto::DecoderModel& m, int seq) {
  const double h = m.hidden(), f = m.ffn_hidden();
  const double head_dim = h / m.heads();
  const double projections = 2 * (2 * h * h + 2 * h * m.kv_heads() * head_dim);
  const double experts = m.experts() > 0 ? m.top_k() : 1;  // the experts a token runs
  const double router = m.experts() > 0 ? 2 * h * m.experts() : 0;
  const double mlp = experts * 2 * (m.activation() == "gelu" ? 2 : 3) * h * f + router;
  const double attention = 2 * 2 * double(seq) * h;  // QK^T and PV, in full
  return m.layers() * (projections + mlp + attention) + 2 * h * m.vocab();
}

std::vector<int> StageLayers(const proto::DecoderModel& model, int pp) {
  NEURON_CHECK(pp >= 1 && pp <= model.layers(), "pp (", pp, ") must be between 1 and the ",
               "model's ", model.layers(), " layers");
  std::vector<int> layers(static_cast<std::size_t>(pp), model.layers() / pp);
  for (int i = 0; i < model.layers() % pp; ++i) ++layers[static_cast<std::size_t>(i)];
  return layers;
}

}  // namespace neuron::parallel
