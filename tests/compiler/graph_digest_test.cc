// GraphDigest: every field of the IR that changes what a graph computes
// changes the digest; labels (graph name, source lines) do not.
#include "neuron/compiler/graph_digest.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "neuron/compiler/graph_text.h"

namespace neuron::compiler {
namespace {

proto::Graph Base() {
  proto::Graph g = ParseGraph(
      "graph g(%x: f32[2,3], %y: f32[2,3]) {\n"
      "  %0: f32[2,3] = aten.add(%x, %y)\n"
      "  %1: f32[3,2] = aten.permute(%0) {dims = [1, 0], alpha = 1, beta = 2.5, mode = \"a\"}\n"
      "  return %1\n"
      "}\n");
  auto* c = g.add_constants();
  c->mutable_value()->set_name("c");
  c->mutable_value()->mutable_type()->set_dtype("f32");
  c->mutable_value()->mutable_type()->add_shape(1);
  c->set_data(std::string(4, '\0'));
  return g;
}

TEST(GraphDigest, IsAHexSha256AndStable) {
  const std::string d = GraphDigest(Base());
  EXPECT_EQ(d.size(), 64u);
  EXPECT_EQ(d.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(GraphDigest(Base()), d);
}

TEST(GraphDigest, IgnoresLabels) {
  proto::Graph g = Base();
  g.set_name("other");
  g.mutable_nodes(0)->set_source("train.py:12");
  EXPECT_EQ(GraphDigest(g), GraphDigest(Base()));
}

TEST(GraphDigest, AttributeOrderDoesNotMatter) {
  proto::Graph a = Base(), b = Base();
  auto* attrs = b.mutable_nodes(1)->mutable_attrs();
  const proto::Attribute dims = attrs->at("dims");
  attrs->erase("dims");
  (*attrs)["dims"] = dims;  // inserted last now
  EXPECT_EQ(GraphDigest(a), GraphDigest(b));
}

TEST(GraphDigest, EveryComputingFieldChangesIt) {
  const std::string base = GraphDigest(Base());
  const std::vector<std::pair<std::string, std::function<void(proto::Graph&)>>> edits = {
      {"input name", [](proto::Graph& g) { g.mutable_inputs(0)->set_name("z"); }},
      {"input dtype", [](proto::Graph& g) { g.mutable_inputs(0)->mutable_type()->set_dtype("bf16"); }},
      {"input shape", [](proto::Graph& g) { g.mutable_inputs(0)->mutable_type()->set_shape(0, 4); }},
      {"extra input", [](proto::Graph& g) { *g.add_inputs() = g.inputs(0); }},
      {"constant data", [](proto::Graph& g) { (*g.mutable_constants(0)->mutable_data())[0] = 1; }},
      {"constant shape", [](proto::Graph& g) { g.mutable_constants(0)->mutable_value()->mutable_type()->add_shape(1); }},
      {"constant name", [](proto::Graph& g) { g.mutable_constants(0)->mutable_value()->set_name("d"); }},
      {"constant dtype", [](proto::Graph& g) { g.mutable_constants(0)->mutable_value()->mutable_type()->set_dtype("i32"); }},
      {"node output name", [](proto::Graph& g) { g.mutable_nodes(0)->mutable_outputs(0)->set_name("z0"); }},
      {"node output dtype", [](proto::Graph& g) { g.mutable_nodes(0)->mutable_outputs(0)->mutable_type()->set_dtype("f16"); }},
      {"node op", [](proto::Graph& g) { g.mutable_nodes(0)->set_op("aten.sub"); }},
      {"node inputs", [](proto::Graph& g) { g.mutable_nodes(0)->set_inputs(1, "x"); }},
      {"node output shape", [](proto::Graph& g) { g.mutable_nodes(1)->mutable_outputs(0)->mutable_type()->set_shape(0, 6); }},
      {"int attribute", [](proto::Graph& g) { (*g.mutable_nodes(1)->mutable_attrs())["alpha"].set_i(2); }},
      {"float attribute", [](proto::Graph& g) { (*g.mutable_nodes(1)->mutable_attrs())["beta"].set_f(2.25); }},
      {"string attribute", [](proto::Graph& g) { (*g.mutable_nodes(1)->mutable_attrs())["mode"].set_s("b"); }},
      {"ints attribute", [](proto::Graph& g) { (*g.mutable_nodes(1)->mutable_attrs())["dims"].mutable_ints()->set_values(0, 0); }},
      {"attribute kind", [](proto::Graph& g) { (*g.mutable_nodes(1)->mutable_attrs())["alpha"].set_f(1.0); }},
      {"attribute name", [](proto::Graph& g) {
         auto* attrs = g.mutable_nodes(1)->mutable_attrs();
         (*attrs)["gamma"] = attrs->at("alpha");
         attrs->erase("alpha");
       }},
      {"outputs", [](proto::Graph& g) { g.set_outputs(0, "0"); }},
      // Length prefixes: moving a character between neighbouring strings
      // must not give the same bytes.
      {"string boundaries", [](proto::Graph& g) {
         g.mutable_nodes(0)->set_op("aten.addx");
         g.mutable_nodes(0)->set_inputs(0, "");
       }},
  };
  for (const auto& [what, edit] : edits) {
    proto::Graph g = Base();
    edit(g);
    EXPECT_NE(GraphDigest(g), base) << what;
  }
}

// The encoder writes the IR field by field: a field added to graph.proto
// must be added to GraphDigest (or listed here as a label) on purpose.
TEST(GraphDigest, KnowsEveryFieldOfTheIr) {
  const std::map<std::string, std::set<std::string>> known = {
      {"TensorType", {"dtype", "shape"}},
      {"Value", {"name", "type"}},
      {"Ints", {"values"}},
      {"Attribute", {"i", "f", "s", "ints"}},
      {"Node", {"op", "inputs", "outputs", "attrs", "source"}},  // source: a label
      {"Constant", {"value", "data"}},
      {"Graph", {"name", "inputs", "constants", "nodes", "outputs"}},  // name: a label
  };
  const auto* file = proto::Graph::descriptor()->file();
  ASSERT_EQ(file->message_type_count(), static_cast<int>(known.size()));
  for (int m = 0; m < file->message_type_count(); ++m) {
    const auto* message = file->message_type(m);
    ASSERT_TRUE(known.count(message->name())) << message->name();
    std::set<std::string> fields;
    for (int f = 0; f < message->field_count(); ++f) fields.insert(message->field(f)->name());
    EXPECT_EQ(fields, known.at(message->name())) << message->name();
  }
}

}  // namespace
}  // namespace neuron::compiler
