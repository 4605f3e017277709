#include "neuron/parallel/decoder_model.h"

#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"

namespace neuron::parallel {

namespace {

void CheckRange(const std::string& origin, const char* field, long long value, long long max) {
  NEURON_CHECK(value >= 1 && value <= max, origin, ": ", field, " must be between 1 and ",
               max, ", got ", value);
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
}

proto::DecoderModel LoadDecoderModel(const std::string& path) {
  proto::DecoderModel model;
  runtime::ParseTextProto(runtime::ReadTextFile(path, "model"), path, "model", &model);
  CheckDecoderModel(model, path);
  return model;
}

double DecoderParameters(const proto::DecoderModel& m) {
  const double h = m.hidden(), f = m.ffn_hidden(), v = m.vocab();
  const double head_dim = h / m.heads();
  const double attention = h * h * 2 + 2 * h * m.kv_heads() * head_dim;  // q, o; k, v
  const bool gelu = m.activation() == "gelu";
  const double mlp = gelu ? 2 * h * f + f + h : 3 * h * f;
  const double norms = m.norm() == "layernorm" ? 4 * h : 2 * h;
  const double biases = gelu ? h + 2 * m.kv_heads() * head_dim + h : 0;  // qkv, o
  const double layer = attention + mlp + norms + biases;
  const double positions = m.position() == "learned" ? double(m.max_seq()) * h : 0;
  const double head = m.tied_embeddings() ? 0 : v * h;
  const double final_norm = m.norm() == "layernorm" ? 2 * h : h;
  return v * h + positions + m.layers() * layer + final_norm + head;
}

double ForwardFlopsPerToken(const proto::DecoderModel& m, int seq) {
  const double h = m.hidden(), f = m.ffn_hidden();
  const double head_dim = h / m.heads();
  const double projections = 2 * (2 * h * h + 2 * h * m.kv_heads() * head_dim);
  const double mlp = 2 * (m.activation() == "gelu" ? 2 : 3) * h * f;
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
