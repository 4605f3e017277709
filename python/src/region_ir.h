// Adaptive eager's regions (runtime/aten adaptive_eager.h) as the
// compiler's IR text, for the region pricer (adaptive_eager_bindings.cc).
//
// Usage:
//   if (RegionExpressesOp(info) && RegionTakesRun(info, arguments, results)) ... queue it ...
//   std::string text = RegionToIr(region, "adaptive_region");
//   auto graph = ParseGraph(text);
//
// The region's dataflow is rebuilt from its tensors' identities: a tensor
// read whose memory, offset, shape and strides match a value the region
// wrote is that value; a contiguous reshape or dense permutation of one is
// an aten.view or aten.permute of it; any other tensor is an input of the
// region (an input stored as a dense permutation is declared in its memory
// order and permuted, as torchneuron/fx_to_ir.py declares graph inputs).
// In-place and out= ops are their functional op, their result a new value
// of the tensor they write. lerp, addcmul and addcdiv are written as the
// elementwise ops they compute (add and sub with alpha other than 1: a mul
// by alpha and the op); fill_ and zero_ as aten.full and aten.zeros;
// a copy between neuron tensors as aten.clone. Numbers the Python code
// passes as tensors (wrapped scalars: a learning rate, a bias correction)
// and the scalars of the written-out lerp, addcmul, addcdiv, add and sub
// are f32[] inputs (fill_'s value is aten.full's attribute), so a region whose
// numbers change from step to step keeps its IR (and its compile cache
// entry). The results are the values written whose memory something still
// holds at the flush; the rest stays inside the plan.
#pragma once

#include <string>

#include "neuron/aten/adaptive_eager.h"

namespace neuron::python {

// Whether the IR can express `info`: a native op of the compiler's table,
// one written out as above, or a copy between neuron tensors.
bool RegionExpressesOp(const aten::OpInfo& info);
// Whether it can express this run of it: every result a defined
// floating-point tensor, a copy's source of its result's dtype (the IR has
// no conversion).
bool RegionTakesRun(const aten::OpInfo& info,
                    const std::vector<aten::adaptive::Argument>& arguments,
                    c10::ArrayRef<at::Tensor> results);

// The IR text of graph `name` computing `region`; InvalidUsage naming the
// op (its index and name) the IR cannot express.
std::string RegionToIr(const aten::adaptive::Region& region, const std::string& name);

}  // namespace neuron::python
