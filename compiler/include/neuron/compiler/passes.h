// Graph passes, each a small unit checked by golden text tests
// (tests/compiler/passes_test.cc).
//
// Usage:
//   proto::Graph g = ParseGraph(text);
//   VerifyGraph(g);                         // throws InvalidUsage naming the node
//   int folded = FoldConstants(g);
//   int merged = EliminateCommonSubexpressions(g);
//   int removed = EliminateDeadCode(g);
//   int layouts = FoldTransposes(g);
//   int read_transposed = FoldTransposesIntoMatmuls(g);
//
// Ops with side effects or randomness (names containing "dropout", "rand"
// or "bernoulli", and in-place ops ending in '_') are never removed or
// merged.
#pragma once

#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

// SSA and types: unique names, every use after its definition, outputs
// defined, known dtypes, non-negative dimensions.
void VerifyGraph(const proto::Graph& graph);

bool HasSideEffects(const proto::Node& node);

// Removes nodes and constants nothing (transitively) returns; the count.
int EliminateDeadCode(proto::Graph& graph);
// Replaces a node equal to an earlier one (op, inputs, attributes, output
// types) by it; the count of nodes removed.
int EliminateCommonSubexpressions(proto::Graph& graph);
// Evaluates f32 nodes whose inputs are all constants (add, sub, mul with
// alpha, neg, relu, t, view, reshape; same shapes or a one-element operand)
// into constants; the count.
int FoldConstants(proto::Graph& graph);
// Layout: composes a layout op (t, transpose.int, permute) of another one's
// result into one permute of the original value, and drops the pair when
// they cancel (t(t(x)) is x); dead code elimination then removes what is no
// longer read. The count of layout ops folded.
int FoldTransposes(proto::Graph& graph);
// Matmuls read a transposed operand in place: an operand of mm, addmm or
// bmm that a layout op made by swapping its input's last two dims (t,
// transpose.int, permute; a bmm's batch dim kept) is replaced by that
// input, with the node attribute transpose_lhs or transpose_rhs set to 1
// (the tensor engine takes either layout; the cost model charges the
// product only). Dead code elimination then removes a layout op nothing
// else reads. The count of operands folded.
int FoldTransposesIntoMatmuls(proto::Graph& graph);

}  // namespace neuron::compiler
