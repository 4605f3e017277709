// The IR's text form, for golden tests and debugging:
//
//   graph mlp(%x: f32[4,8], %w: f32[8,16]) {
//     const %b: f32[2] = [0.5, -1]
//     %0: f32[4,16] = aten.mm(%x, %w)
//     %1: f32[4,16] = aten.add(%0, %b) {alpha = 1}  # train.py:7
//     return %1
//   }
//
// A comment ending a node's line is its source (proto::Node.source, named
// by errors); other comments are ignored.
// Attributes: integers (`dim = 1`), floats (`eps = 1e-05`, always with a
// '.' or exponent), strings (`reduction = "mean"`), integer lists
// (`perm = [1, 0]`). Constants of dtype f32 are written as their values,
// others as `0x` and their bytes in hex.
#pragma once

#include <string>

#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

std::string PrintGraph(const proto::Graph& graph);
// Throws InvalidUsage naming `origin`, the line and column, and what was
// expected.
proto::Graph ParseGraph(const std::string& text, const std::string& origin = "<text>");

}  // namespace neuron::compiler
