// The executor's custom kernel family (proto::OP_CUSTOM_KERNEL): the
// instruction's HBM buffers handed to the callback registered under its
// kernel key (custom_kernels.h). Defined in custom_kernels.cc.
#pragma once

#include <vector>

#include "exec_kernels.h"

namespace neuron::runtime::detail {

void RunCustom(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what);

}  // namespace neuron::runtime::detail
