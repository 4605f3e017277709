// Composed strided copies (after lowering, before fusion): a value that
// strided copies write and one strided copy then permutes whole is never
// made. Each writer puts its elements straight where that reader would have
// copied them, and the reader goes, with one pass over the value's bytes:
// the backward of attention's head split, which stacks the gradients of q,
// k and v (one of them a transpose) and permutes the stack back to
// [seq, batch, heads, 3, head_dim], writes that layout directly.
//
// A value T composes into its reader R when
// - T is an SBUF value with no parts that no step but R reads (not
//   stored), and R reads all of it from element 0 with one stride per dim
//   of T of more than one element (a permute of T);
// - every step that writes T is a strided copy before R whose output
//   strides each step along a dim of T, its elements a box of T's indices
//   (a stack's slice, a transpose's whole);
// - between the first writer and R no step reads R's output, nor writes
//   it but a strided copy of other elements, and no writer reads it.
// Writers composed into R may compose in turn into an earlier copy.
#pragma once

#include "lowering_context.h"

namespace neuron::compiler {

// Composes the copies of cx.steps() that qualify; returns how many values
// it removed.
int ComposeStridedCopies(LoweringContext& cx);

}  // namespace neuron::compiler
