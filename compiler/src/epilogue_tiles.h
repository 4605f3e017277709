// Epilogue tiles (after fusion, before placement): an elementwise step, or
// a fused chain, that reads a value written in row tiles (a tiled matmul's
// result, each tile leaving PSUM into its rows) runs as one piece per tile,
// each placed right after its tile is written, as the device's activation
// engine applies an epilogue to each tile as the tensor engine produces
// it: the pieces overlap the next tiles' matmuls, and each reads its rows
// while they are fresh (on the host, in cache).
//
// A step is split when
// - it writes one whole SBUF value of its own elements, which no step
//   between its first piece and it reads or writes;
// - one of its reads is a whole SBUF value of its elements written only in
//   parts, each part once, by steps before it, the parts together every
//   element in order (the tiles);
// - every other read has its elements (read by the same rows) or repeats
//   within each tile (a bias whose length divides every tile's start), and
//   is not written after the step its piece follows;
// - its pieces do not all wait for the last tile.
// Each piece reads and writes parts (AddPart) of the step's operands. An
// input the lowering loads only where the step reads it (after the tiles)
// is loaded just before the first piece instead.
#pragma once

#include "lowering_context.h"

namespace neuron::compiler {

// Splits the steps of cx.steps() that qualify; returns how many it split.
int TileEpilogues(LoweringContext& cx);

}  // namespace neuron::compiler
