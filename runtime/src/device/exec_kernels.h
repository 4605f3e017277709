// The executor's kernel families: one entry point per family named in the
// op registry's Kernel column (device_ops.h), Run##Kernel, which
// executor.cc's dispatch table calls for each instruction of a plan. Each
// family lives in the file that matches its lowering (compiler/src/
// lower_*.cc) and checks its instruction's buffers (count, dtype, size)
// before it touches them, throwing InvalidUsage that names `what`.
// executor.h lists the ops' semantics.
//
//   const detail::Kernel run = detail::RunMatmul;
//   run(instruction, {a, b}, {c}, What{executable, instruction});
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::detail {

// A buffer of the plan and where its bytes are for this run.
struct Placed {
  const proto::Buffer* buffer = nullptr;
  std::uint8_t* data = nullptr;
  std::size_t elements() const {
    const std::size_t size = ElementBytes(buffer->dtype());
    return size == 0 ? 0 : buffer->bytes() / size;
  }
};

// "executable 'name': instruction 7 (matmul)", written only into the
// message of an error (NEURON_CHECK formats its message when it fails).
struct What {
  const proto::Executable& executable;
  const proto::Instruction& instruction;
};
std::ostream& operator<<(std::ostream& out, const What& w);

// A kernel family's entry point: runs instruction `i` reading the buffers
// `in` and writing `out` (the instruction's inputs and outputs, in order).
using Kernel = void (*)(const proto::Instruction& i, const std::vector<Placed>& in,
                        const std::vector<Placed>& out, const What& what);

// exec_views.cc: load, store, spill, reload (DMA) and strided_copy.
void RunDma(const proto::Instruction& i, const std::vector<Placed>& in,
            const std::vector<Placed>& out, const What& what);
void RunStridedCopy(const proto::Instruction& i, const std::vector<Placed>& in,
                    const std::vector<Placed>& out, const What& what);

// exec_matmul.cc: matmul.
void RunMatmul(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what);

// exec_elementwise.cc: the Elementwise rows, fused chains, compare_* and
// where.
void RunElementwise(const proto::Instruction& i, const std::vector<Placed>& in,
                    const std::vector<Placed>& out, const What& what);
void RunFused(const proto::Instruction& i, const std::vector<Placed>& in,
              const std::vector<Placed>& out, const What& what);
void RunSelect(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what);

// exec_rows.cc: the Shaped rows (softmaxes, sum_rows, transpose),
// layer_norm_rows, nll_loss_rows and their backwards.
void RunShaped(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what);
void RunLayerNorm(const proto::Instruction& i, const std::vector<Placed>& in,
                  const std::vector<Placed>& out, const What& what);
void RunNllLoss(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what);

// exec_scans.cc: cumsum and reverse.
void RunScan(const proto::Instruction& i, const std::vector<Placed>& in,
             const std::vector<Placed>& out, const What& what);

// exec_windows.cc: im2col, col2im, maxpool2d and its backward.
void RunIm2Col(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what);
void RunMaxPool(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what);

// exec_indexing.cc: fill and iota, gather_rows and scatter_add_rows,
// dropout, masked_scale and bernoulli.
void RunSequence(const proto::Instruction& i, const std::vector<Placed>& in,
                 const std::vector<Placed>& out, const What& what);
void RunRows(const proto::Instruction& i, const std::vector<Placed>& in,
             const std::vector<Placed>& out, const What& what);
void RunDropout(const proto::Instruction& i, const std::vector<Placed>& in,
                const std::vector<Placed>& out, const What& what);

// The custom kernel family (RunCustom) is exec_custom.h's.

}  // namespace neuron::runtime::detail
