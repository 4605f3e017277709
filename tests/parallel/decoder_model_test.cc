#include "neuron/parallel/decoder_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

std::string Models() { return std::string(NEURON_SOURCE_DIR) + "/configs/models/"; }

// A valid Llama-style model file with `field` set to `value` instead.
std::string Write(const std::string& field = "", const std::string& value = "") {
  std::map<std::string, std::string> fields = {
      {"name", "\"m\""},          {"layers", "2"},       {"hidden", "64"},
      {"heads", "4"},              {"kv_heads", "2"},     {"ffn_hidden", "172"},
      {"vocab", "256"},            {"activation", "\"swiglu\""},
      {"norm", "\"rmsnorm\""},     {"position", "\"rotary\""}};
  if (!field.empty()) fields[field] = value;
  const std::string path = ::testing::TempDir() + "/model.textproto";
  std::ofstream out(path);
  out << "# a test model\n\n";
  for (const auto& [k, v] : fields) out << k << ": " << v << "\n";
  return path;
}

std::string ErrorOf(const std::string& field, const std::string& value) {
  try {
    LoadDecoderModel(Write(field, value));
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "";
}

TEST(DecoderModel, ThePublishedModelsHaveTheirPublishedParameterCounts) {
  // Model cards: Llama 2 6.74B / 13.0B / 69.0B, Llama 3.1 8.03B / 70.6B; the
  // NeMo GPT-3 23B as configured (tied embeddings, 2048 positions): 22.99B.
  const std::map<std::string, double> billions = {
      {"llama2-7b", 6.74},   {"llama2-13b", 13.02},  {"llama2-70b", 68.98},
      {"llama3.1-8b", 8.03}, {"llama3.1-70b", 70.55}, {"gpt3-23b", 22.99}};
  for (const auto& [name, b] : billions) {
    const auto model = LoadDecoderModel(Models() + name + ".textproto");
    EXPECT_EQ(model.name(), name);
    EXPECT_NEAR(DecoderParameters(model) / 1e9, b, 0.01) << name;
  }
}

TEST(DecoderModel, MixtralCountsEveryExpertAndActivatesTwo) {
  // "Mixtral of Experts": 46.7B parameters, 12.9B active per token.
  const auto m = LoadDecoderModel(Models() + "mixtral-8x7b.textproto");
  EXPECT_NEAR(DecoderParameters(m) / 1e9, 46.7, 0.05);
  EXPECT_NEAR(ActiveParameters(m) / 1e9, 12.9, 0.05);
  EXPECT_DOUBLE_EQ(CapacityFactor(m), 1.0);
  // A token's forward: the router and 2 of the 8 experts (not the capacity's padding).
  const double dense_mlp = 2 * 3 * 4096.0 * 14336;
  auto dense = m;
  dense.set_experts(0);
  dense.set_top_k(0);
  dense.set_capacity_factor(0);
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(m, 4096) - ForwardFlopsPerToken(dense, 4096),
                   32 * (dense_mlp + 2 * 4096.0 * 8));
}

TEST(DecoderModel, ExpertFieldsAreCheckedAndNamed) {
  auto error = [](const std::string& experts, const std::string& top_k,
                  const std::string& factor = "0") {
    std::string path = Write("experts", experts);
    std::ofstream(path, std::ios::app) << "top_k: " << top_k << "\ncapacity_factor: " << factor
                                       << "\n";
    try {
      LoadDecoderModel(path);
    } catch (const InvalidUsage& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("8", "2", "1.25"), "");
  EXPECT_NE(error("2", "3").find("model.textproto: top_k (3) must be between 1 and experts (2)"),
            std::string::npos);
  EXPECT_NE(error("4", "0").find("top_k (0) must be between 1 and experts (4)"),
            std::string::npos);
  EXPECT_NE(error("-1", "1").find("model.textproto: experts must be between 1 and 4096"),
            std::string::npos);
  EXPECT_NE(error("4", "2", "-1").find("capacity_factor must be between 0 (1.0) and 64"),
            std::string::npos);
  EXPECT_NE(error("0", "2").find("top_k and capacity_factor are a Mixture of Experts'"),
            std::string::npos);
}

TEST(DecoderModel, ForwardFlopsCountProjectionsMlpAttentionAndHead) {
  const auto m = LoadDecoderModel(Write());
  // Per layer: q, o 2*64*64*2; k, v 2*64*32*2; MLP 3*64*172*2; attention 2*2*seq*64.
  const double layer = 2 * (2 * 64 * 64 + 2 * 64 * 32) + 2 * 3 * 64 * 172 + 4 * 16.0 * 64;
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(m, 16), 2 * layer + 2 * 64 * 256);
}

TEST(DecoderModel, BadFieldsAreNamedWithTheFile) {
  EXPECT_NE(ErrorOf("layers", "0").find("model.textproto: layers must be between 1 and 4096, "
                                        "got 0"), std::string::npos);
  EXPECT_NE(ErrorOf("hidden", "2000000000").find("hidden must be between"), std::string::npos);
  EXPECT_NE(ErrorOf("heads", "5").find("heads (5) do not divide hidden (64)"),
            std::string::npos);
  EXPECT_NE(ErrorOf("kv_heads", "3").find("kv_heads (3) do not divide heads (4)"),
            std::string::npos);
  EXPECT_NE(ErrorOf("activation", "\"relu\"").find("activation must be"), std::string::npos);
  EXPECT_NE(ErrorOf("norm", "\"batch\"").find("norm must be"), std::string::npos);
  EXPECT_NE(ErrorOf("position", "\"alibi\"").find("position must be"), std::string::npos);
  EXPECT_NE(ErrorOf("vocab", "-1").find("vocab must be between"), std::string::npos);
  // A parse error names the line: two lines of heading, then the fields in
  // name order, "layrs" the seventh.
  EXPECT_NE(ErrorOf("layrs", "2").find("model.textproto: line 9, column 6: Message type "
                                       "\"neuron.parallel.proto.DecoderModel\" has no field "
                                       "named \"layrs\""),
            std::string::npos)
      << ErrorOf("layrs", "2");
  EXPECT_THROW(LoadDecoderModel(::testing::TempDir() + "/no-such-model"), InvalidUsage);
}

TEST(DecoderModel, StagesTakeTheLayersEvenlyTheFirstOnesTheRemainder) {
  auto m = LoadDecoderModel(Write("layers", "10"));
  EXPECT_EQ(StageLayers(m, 1), std::vector<int>({10}));
  EXPECT_EQ(StageLayers(m, 4), std::vector<int>({3, 3, 2, 2}));
  EXPECT_EQ(StageLayers(m, 10), std::vector<int>(10, 1));
  try {
    StageLayers(m, 11);
    FAIL() << "pp above the layers";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("pp (11) must be between 1 and the model's 10 layers"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace neuron::parallel
