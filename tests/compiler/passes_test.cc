// The IR's text form round-trips, and each pass turns an input graph into
// the expected one (golden text).
#include "neuron/compiler/passes.h"

#include <gtest/gtest.h>

#include "neuron/compiler/graph_text.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

// Runs `pass` on `input` and compares the printed result with `expected`
// (both as written in the text form).
template <typename Pass>
void ExpectPass(const std::string& input, Pass pass, int count,
                const std::string& expected) {
  proto::Graph g = ParseGraph(input);
  VerifyGraph(g);
  EXPECT_EQ(pass(g), count);
  VerifyGraph(g);
  EXPECT_EQ(PrintGraph(g), PrintGraph(ParseGraph(expected)));
}

TEST(GraphText, PrintAndParseRoundTrip) {
  const std::string text = R"(graph mlp(%x: f32[4,8], %w: bf16[8,16]) {
  const %b: f32[2] = [0.5, -1]
  const %m: bool[3] = 0x010001
  %0: f32[4,16] = aten.mm(%x, %w)
  %1: f32[4,16] = aten.add(%0, %b) {alpha = 1}  # File "train.py", line 7, in forward
  %2: f32[4,16], %3: i64[4] = aten.max.dim(%1) {dim = 1, eps = 1e-05, name = "m", perm = [1, 0]}
  return %2, %3
}
)";
  EXPECT_EQ(PrintGraph(ParseGraph(text)), text);
  const proto::Graph g = ParseGraph(text);
  EXPECT_EQ(g.nodes(0).source(), "");
  EXPECT_EQ(g.nodes(1).source(), "File \"train.py\", line 7, in forward");
}

TEST(GraphText, OnlyACommentEndingANodesLineIsItsSource) {
  const proto::Graph g = ParseGraph(
      "# a graph\ngraph g(%x: f32[2]) {  # its inputs\n"
      "  # the first node\n  %0: f32[2] = aten.neg(%x)\t#  train.py:3  \n"
      "  %1: f32[2] = aten.neg(%0)\n  # not %1's\n  return %1\n}\n");
  ASSERT_EQ(g.nodes_size(), 2);
  EXPECT_EQ(g.nodes(0).source(), "train.py:3");
  EXPECT_EQ(g.nodes(1).source(), "");
}

TEST(GraphText, ParseErrorsNameLineAndColumn) {
  try {
    ParseGraph("graph g(%x: f32[2]) {\n  %0: f32[2] = aten.neg(%x\n  return %0\n}\n",
               "bad.graph");
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(
        std::string(e.what()).find("graph bad.graph: line 3, column 3: expected ')'"),
        std::string::npos)
        << e.what();
  }
}

TEST(Verify, NamesTheNodeAndTheProblem) {
  auto message = [](const std::string& text) -> std::string {
    try {
      VerifyGraph(ParseGraph(text));
    } catch (const InvalidUsage& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message("graph g(%x: f32[2]) {\n %0: f32[2] = aten.neg(%y)\n return %0\n}")
                .find("graph g: node 0 (aten.neg): uses %y before it is defined"),
            std::string::npos);
  EXPECT_NE(message("graph g(%x: f32[2]) {\n %0: f32[2] = aten.neg(%y)  # train.py:3\n"
                    " return %0\n}")
                .find("graph g: node 0 (aten.neg) from train.py:3: uses %y"),
            std::string::npos);
  EXPECT_NE(message("graph g(%x: f32[2]) {\n %x: f32[2] = aten.neg(%x)\n return %x\n}")
                .find("%x is defined twice"),
            std::string::npos);
  EXPECT_NE(message("graph g(%x: q7[2]) {\n return %x\n}").find("unknown dtype 'q7'"),
            std::string::npos);
  EXPECT_NE(message("graph g(%x: f32[2]) {\n return %z\n}").find("returns %z"),
            std::string::npos);
}

TEST(Passes, DeadCodeKeepsWhatIsReturnedAndWhatHasEffects) {
  ExpectPass(R"(graph g(%x: f32[4]) {
    const %unused: f32[1] = [3]
    %0: f32[4] = aten.relu(%x)
    %1: f32[4] = aten.neg(%0)
    %2: f32[4], %3: bool[4] = aten.native_dropout(%x) {p = 0.1}
    %4: f32[4] = aten.exp(%x)
    return %1
  })",
             EliminateDeadCode, 1, R"(graph g(%x: f32[4]) {
    %0: f32[4] = aten.relu(%x)
    %1: f32[4] = aten.neg(%0)
    %2: f32[4], %3: bool[4] = aten.native_dropout(%x) {p = 0.1}
    return %1
  })");
}

TEST(Passes, CommonSubexpressionsMergeOnlyEqualPureNodes) {
  ExpectPass(R"(graph g(%x: f32[4], %y: f32[4]) {
    %0: f32[4] = aten.add(%x, %y) {alpha = 1}
    %1: f32[4] = aten.add(%x, %y) {alpha = 1}
    %2: f32[4] = aten.add(%x, %y) {alpha = 2}
    %3: f32[4] = aten.mul(%0, %1)
    %4: f32[4] = aten.mul(%1, %0)
    %5: f32[4] = aten.rand_like(%x)
    %6: f32[4] = aten.rand_like(%x)
    return %3, %4, %2, %5, %6
  })",
             EliminateCommonSubexpressions, 2, R"(graph g(%x: f32[4], %y: f32[4]) {
    %0: f32[4] = aten.add(%x, %y) {alpha = 1}
    %2: f32[4] = aten.add(%x, %y) {alpha = 2}
    %3: f32[4] = aten.mul(%0, %0)
    %5: f32[4] = aten.rand_like(%x)
    %6: f32[4] = aten.rand_like(%x)
    return %3, %3, %2, %5, %6
  })");
}

TEST(Passes, ConstantFoldingEvaluatesF32Chains) {
  ExpectPass(R"(graph g(%x: f32[2,2]) {
    const %a: f32[2,2] = [1, 2, 3, 4]
    const %s: f32[1] = [10]
    %0: f32[2,2] = aten.t(%a)
    %1: f32[2,2] = aten.add(%0, %s) {alpha = 2}
    %2: f32[4] = aten.view(%1) {size = [4]}
    %3: f32[2,2] = aten.mul(%x, %1)
    %4: f32[2,2] = aten.rand_like(%a)
    return %3, %2, %4
  })",
             FoldConstants, 3, R"(graph g(%x: f32[2,2]) {
    const %a: f32[2,2] = [1, 2, 3, 4]
    const %s: f32[1] = [10]
    const %0: f32[2,2] = [1, 3, 2, 4]
    const %1: f32[2,2] = [21, 23, 22, 24]
    const %2: f32[4] = [21, 23, 22, 24]
    %3: f32[2,2] = aten.mul(%x, %1)
    %4: f32[2,2] = aten.rand_like(%a)
    return %3, %2, %4
  })");
}

TEST(Passes, LayoutOpsComposeAndCancel) {
  ExpectPass(R"(graph g(%x: f32[2,3,4], %w: f32[3,5]) {
  %a: f32[5,3] = aten.t(%w)
  %b: f32[3,5] = aten.t(%a)
  %p: f32[4,2,3] = aten.permute(%x) {dims = [2, 0, 1]}
  %q: f32[2,4,3] = aten.transpose.int(%p) {dim0 = 0, dim1 = 1}
  %r: f32[3,5] = aten.relu(%b)
  return %r, %q
})",
             FoldTransposes, 2, R"(graph g(%x: f32[2,3,4], %w: f32[3,5]) {
  %a: f32[5,3] = aten.t(%w)
  %p: f32[4,2,3] = aten.permute(%x) {dims = [2, 0, 1]}
  %q: f32[2,4,3] = aten.permute(%x) {dims = [0, 2, 1]}
  %r: f32[3,5] = aten.relu(%w)
  return %r, %q
})");
}

TEST(Passes, MatmulsReadTransposedOperandsInPlace) {
  // t of a weight, a bmm's swapped last dims (lhs and rhs), addmm's
  // operands; not a permute that moves the batch dim, nor an operand whose
  // attribute is already set. The layout ops stay for dead code elimination
  // (%kt is returned too).
  ExpectPass(
      R"(graph g(%x: f32[4,8], %w: f32[16,8], %b: f32[16], %q: f32[2,3,5], %k: f32[2,3,5], %y: f32[8,4]) {
  %wt: f32[8,16] = aten.t(%w)
  %mm: f32[4,16] = aten.mm(%x, %wt)
  %kt: f32[2,5,3] = aten.transpose.int(%k) {dim0 = -1, dim1 = -2}
  %s: f32[2,3,3] = aten.bmm(%q, %kt)
  %qt: f32[2,5,3] = aten.permute(%q) {dims = [0, 2, 1]}
  %o: f32[2,5,5] = aten.bmm(%qt, %k)
  %moved: f32[3,2,5] = aten.permute(%q) {dims = [1, 0, 2]}
  %yt: f32[4,8] = aten.t(%y)
  %am: f32[4,16] = aten.addmm(%b, %yt, %wt)
  %kept: f32[4,16] = aten.mm(%x, %wt) {transpose_rhs = 0}
  return %mm, %s, %o, %moved, %am, %kept, %kt
})",
      FoldTransposesIntoMatmuls, 5,
      R"(graph g(%x: f32[4,8], %w: f32[16,8], %b: f32[16], %q: f32[2,3,5], %k: f32[2,3,5], %y: f32[8,4]) {
  %wt: f32[8,16] = aten.t(%w)
  %mm: f32[4,16] = aten.mm(%x, %w) {transpose_rhs = 1}
  %kt: f32[2,5,3] = aten.transpose.int(%k) {dim0 = -1, dim1 = -2}
  %s: f32[2,3,3] = aten.bmm(%q, %k) {transpose_rhs = 1}
  %qt: f32[2,5,3] = aten.permute(%q) {dims = [0, 2, 1]}
  %o: f32[2,5,5] = aten.bmm(%q, %k) {transpose_lhs = 1}
  %moved: f32[3,2,5] = aten.permute(%q) {dims = [1, 0, 2]}
  %yt: f32[4,8] = aten.t(%y)
  %am: f32[4,16] = aten.addmm(%b, %y, %w) {transpose_lhs = 1, transpose_rhs = 1}
  %kept: f32[4,16] = aten.mm(%x, %wt) {transpose_rhs = 0}
  return %mm, %s, %o, %moved, %am, %kept, %kt
})");
}

TEST(Passes, TheyComposeIntoACleanGraph) {
  proto::Graph g = ParseGraph(R"(graph g(%x: f32[2]) {
    const %one: f32[1] = [1]
    const %two: f32[1] = [2]
    %0: f32[1] = aten.add(%one, %one) {alpha = 1}
    %1: f32[2] = aten.mul(%x, %0)
    %2: f32[2] = aten.mul(%x, %two)
    %3: f32[2] = aten.add(%1, %2) {alpha = 1}
    return %3
  })");
  EXPECT_EQ(FoldConstants(g), 1);
  EXPECT_EQ(EliminateCommonSubexpressions(g), 0);  // %0 and %two are different values
  EXPECT_EQ(EliminateDeadCode(g), 0);
  VerifyGraph(g);
  EXPECT_EQ(g.constants_size(), 2);  // %one is dead once folded; %0 and %two live
}

}  // namespace
}  // namespace neuron::compiler

namespace neuron::compiler {
namespace {

TEST(GraphText, BadNumbersAreParseErrorsWithAPosition) {
  try {
    ParseGraph(
        "graph g(%x: f32[2]) {\n  %0: f32[2] = aten.neg(%x) {k = True}\n  return "
        "%0\n}\n");
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(
        std::string(e.what()).find("line 2, column 34: expected a number, found 'True"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ParseGraph("graph g(%x: f32[2x]) {\n return %x\n}"), InvalidUsage);
}

}  // namespace
}  // namespace neuron::compiler
