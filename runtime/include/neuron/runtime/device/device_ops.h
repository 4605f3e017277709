// The device's operations, one row each: the registry the compiler's
// lowering, the executor's kernels, the cost model and docs/operators.md
// agree through. The executable format names them with proto::Op
// (executable.proto), one enumerator per row (a test keeps the two equal).
//
//   X(Id, Kernel, Inputs, Passes)
//     Id       proto::OP_##Id; the op's name is Id in lower case ("sum_rows")
//     Kernel   the executor's kernel family that runs it (Run##Kernel, one
//              file a family: runtime/src/device/exec_kernels.h lists
//              them); Elementwise ops also fuse (OP_FUSED)
//     Inputs   the tensors an Elementwise, Shaped or Scan op reads (1 or 2); 0
//              for the others, whose instructions say
//     Passes   the cost: passes over the op's elements on its engine (the
//              cost model's operand count); 0: one per input read, at
//              least one
//
// Usage:
//   DeviceOpName(proto::OP_SUM_ROWS)         // "sum_rows"
//   FindDeviceOp(i.op())->passes              // null: not an op
//   #define CASE(Id, Kernel, Inputs, Passes) case proto::OP_##Id: return Run##Kernel;
#pragma once

#include <cstddef>
#include <string>

#include "neuron/runtime/executable.pb.h"

#define NEURON_FORALL_DEVICE_OPS(X)            \
  X(LOAD, Dma, 0, 0)                           \
  X(STORE, Dma, 0, 0)                          \
  X(SPILL, Dma, 0, 0)                          \
  X(RELOAD, Dma, 0, 0)                         \
  X(MATMUL, Matmul, 0, 0)                      \
  X(FUSED, Fused, 0, 0)                        \
  X(COPY, Elementwise, 1, 0)                   \
  X(RELU, Elementwise, 1, 0)                   \
  X(NEG, Elementwise, 1, 0)                    \
  X(ABS, Elementwise, 1, 0)                    \
  X(SIGN, Elementwise, 1, 0)                   \
  X(EXP, Elementwise, 1, 0)                    \
  X(TANH, Elementwise, 1, 0)                   \
  X(SIGMOID, Elementwise, 1, 0)                \
  X(GELU, Elementwise, 1, 0)                   \
  X(GELU_EXACT, Elementwise, 1, 0)             \
  X(SCALE, Elementwise, 1, 0)                  \
  X(ADD_SCALAR, Elementwise, 1, 0)             \
  X(ADD, Elementwise, 2, 0)                    \
  X(SUB, Elementwise, 2, 0)                    \
  X(MUL, Elementwise, 2, 0)                    \
  X(DIV, Elementwise, 2, 0)                    \
  X(MAX, Elementwise, 2, 0)                    \
  X(MIN, Elementwise, 2, 0)                    \
  X(TANH_BACKWARD, Elementwise, 2, 0)          \
  X(SIGMOID_BACKWARD, Elementwise, 2, 0)       \
  X(GELU_BACKWARD, Elementwise, 2, 0)          \
  X(GELU_EXACT_BACKWARD, Elementwise, 2, 0)    \
  X(THRESHOLD_BACKWARD, Elementwise, 2, 0)     \
  X(TRANSPOSE, Shaped, 1, 0)                   \
  X(SUM_ROWS, Shaped, 1, 0)                    \
  X(SOFTMAX_ROWS, Shaped, 1, 3)                \
  X(LOG_SOFTMAX_ROWS, Shaped, 1, 3)            \
  X(SOFTMAX_BACKWARD_ROWS, Shaped, 2, 3)       \
  X(LOG_SOFTMAX_BACKWARD_ROWS, Shaped, 2, 3)   \
  X(COMPARE_EQ, Select, 0, 0)                  \
  X(COMPARE_NE, Select, 0, 0)                  \
  X(COMPARE_LT, Select, 0, 0)                  \
  X(COMPARE_LE, Select, 0, 0)                  \
  X(COMPARE_GT, Select, 0, 0)                  \
  X(COMPARE_GE, Select, 0, 0)                  \
  X(WHERE, Select, 0, 0)                       \
  X(MASKED_FILL, Elementwise, 2, 0)            \
  X(FILL, Sequence, 0, 0)                      \
  X(IOTA, Sequence, 0, 0)                      \
  X(STRIDED_COPY, StridedCopy, 0, 1)           \
  X(IM2COL, Im2Col, 0, 1)                      \
  X(COL2IM, Im2Col, 0, 1)                      \
  X(MAXPOOL2D, MaxPool, 0, 1)                  \
  X(MAXPOOL2D_BACKWARD, MaxPool, 0, 1)         \
  X(DROPOUT, Dropout, 0, 0)                    \
  X(MASKED_SCALE, Dropout, 0, 0)               \
  X(BERNOULLI, Dropout, 0, 0)                  \
  X(GATHER_ROWS, Rows, 0, 1)                   \
  X(SCATTER_ADD_ROWS, Rows, 0, 1)              \
  X(NLL_LOSS_ROWS, NllLoss, 0, 1)              \
  X(NLL_LOSS_BACKWARD_ROWS, NllLoss, 0, 1)     \
  X(LAYER_NORM_ROWS, LayerNorm, 0, 3)          \
  X(LAYER_NORM_BACKWARD_ROWS, LayerNorm, 0, 5) \
  X(CLAMP_MIN, Elementwise, 1, 0)              \
  X(CLAMP_MAX, Elementwise, 1, 0)              \
  X(CUMSUM, Scan, 1, 1)                        \
  X(REVERSE, Scan, 1, 1)                       \
  X(CUSTOM_KERNEL, Custom, 0, 0)               \
  X(SQRT, Elementwise, 1, 0)                   \
  X(RSQRT, Elementwise, 1, 0)

namespace neuron::runtime {

struct DeviceOp {
  proto::Op op;
  const char* name;    // "sum_rows"
  const char* kernel;  // "Shaped"
  int inputs;
  int passes;
  bool fusible;  // an Elementwise op: it may be a step of an OP_FUSED chain
  bool dma;      // a Dma op: it runs on the DMA engine, and only those do
};

// The registry's row of `op`; null for OP_UNSPECIFIED and values outside
// the enum (a damaged or newer executable).
const DeviceOp* FindDeviceOp(proto::Op op);
// Every row, in the enum's order.
const DeviceOp* DeviceOps(std::size_t* count);
// `op`'s name, or "op N" for one outside the registry.
std::string DeviceOpName(proto::Op op);

}  // namespace neuron::runtime
