// How each IR op becomes device steps: one function per family of ops,
// named by the op's row in the native op table (native_ops.cc), which
// LowerNode dispatches through. Each checks the node (inputs, outputs,
// attributes) and refuses what the device does not run with InvalidUsage
// naming `where`.
#pragma once

#include <string>
#include <vector>

#include "lowering_context.h"
#include "neuron/compiler/graph.pb.h"

namespace neuron::compiler {

struct OpCall {
  const proto::Node& node;
  const std::vector<std::string>& in;  // the inputs' on-chip slots, in order
  const std::string& where;            // "graph G: node I (op) from SOURCE"
  const std::string& source;           // the node's source line, else its op
};

// The node's one output (InvalidUsage when it has another number).
const proto::Value& SingleOutput(const OpCall& call);

// lower_elementwise.cc
void LowerArithmetic(LoweringContext& cx,
                     const OpCall& call);  // add, sub, mul, div (and .Scalar)
void LowerBinary(LoweringContext& cx,
                 const OpCall& call);                      // maximum, minimum, *_backward
void LowerUnary(LoweringContext& cx, const OpCall& call);  // relu, exp, gelu, ...
void LowerCompare(LoweringContext& cx, const OpCall& call);  // eq, ne, lt, le, gt, ge
void LowerWhere(LoweringContext& cx, const OpCall& call);
void LowerMaskedFill(LoweringContext& cx, const OpCall& call);
void LowerThresholdBackward(LoweringContext& cx, const OpCall& call);
void LowerClamp(LoweringContext& cx, const OpCall& call);  // clamp, hardtanh and backward
void LowerGeluBackward(LoweringContext& cx, const OpCall& call);
// lower_matmul.cc
void LowerMatmul(LoweringContext& cx, const OpCall& call);  // mm, addmm, bmm
// lower_rows.cc
void LowerRowwise(LoweringContext& cx,
                  const OpCall& call);  // softmax, log_softmax, backward
void LowerLayerNorm(LoweringContext& cx, const OpCall& call);
void LowerNllLoss(LoweringContext& cx, const OpCall& call);
void LowerSum(LoweringContext& cx, const OpCall& call);  // sum, mean (any dims)
// lower_scans.cc
void LowerCumsum(LoweringContext& cx, const OpCall& call);  // along any dim
void LowerFlip(LoweringContext& cx, const OpCall& call);    // any dims, any dtype
// lower_views.cc
void LowerCopy(LoweringContext& cx, const OpCall& call);  // view, reshape, ...: an alias
void LowerTranspose2d(LoweringContext& cx, const OpCall& call);  // aten.t
void LowerView(LoweringContext& cx, const OpCall& call);  // permute, slice, cat, ...
void LowerFill(LoweringContext& cx,
               const OpCall& call);  // constants, slice/select_backward
// lower_indexing.cc
void LowerIndexing(LoweringContext& cx, const OpCall& call);  // embedding, arange
void LowerDropout(LoweringContext& cx, const OpCall& call);   // dropout, bernoulli
// lower_windows.cc
void LowerWindows(LoweringContext& cx, const OpCall& call);  // convolution, max pooling

}  // namespace neuron::compiler
