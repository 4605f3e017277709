// The state of one graph's lowering, and the steps the op lowerings
// (op_lowerings.h) build with: every value's slot (where it lives) and the
// instructions before placement, in program order. Fusion (fusion.h),
// spilling (spill.h) and emission (emit.h) work on it after the nodes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "neuron/compiler/graph.pb.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::compiler {

namespace rp = runtime::proto;

// A value of the program and where it lives.
struct Slot {
  proto::Value value;
  rp::MemorySpace space = rp::SBUF;
  rp::ElementType dtype = rp::F32;
  std::uint64_t bytes = 0;
  std::uint32_t buffer = 0;
  std::string alias_of;  // a view: the slot whose bytes it is ("": its own)
  // A part: a buffer of its own inside `part_of`'s bytes (an SBUF slot,
  // planned as one value with it: its reads and writes are the whole's for
  // liveness, fusion and spilling), `part_offset` bytes from its start.
  std::string part_of;
  std::uint64_t part_offset = 0;
};

// An instruction before placement: values by slot name.
struct Step {
  rp::Instruction instruction;  // engine, op, cost parameters, source
  std::vector<std::string> reads, writes;
  // A fused step: per sub-op, the slots it reads ("" for the previous result).
  std::vector<std::vector<std::string>> fused_reads;
};

// A matmul's sizes: out[m, n] = lhs[m, k] x rhs[k, n], `batch` of them when
// > 0; lhs stored as [k, m] and rhs as [n, k] when transposed (read in
// place: the instruction's transpose_lhs and transpose_rhs).
struct MatmulDims {
  std::int64_t m = 0, k = 0, n = 0, batch = 0;
  bool transpose_lhs = false, transpose_rhs = false;
};

class LoweringContext {
 public:
  LoweringContext(const proto::Graph& g, const runtime::DeviceSpec& device)
      : g_(g), device_(device) {}

  const proto::Graph& graph() const { return g_; }
  const runtime::DeviceSpec& device() const { return device_; }
  std::unordered_map<std::string, Slot>& slots() { return slots_; }
  const std::unordered_map<std::string, Slot>& slots() const { return slots_; }
  std::vector<std::string>& order() { return order_; }  // slots in creation order
  std::vector<Step>& steps() { return steps_; }
  const std::vector<Step>& steps() const { return steps_; }

  bool Has(const std::string& name) const { return slots_.count(name) > 0; }
  const proto::Value& ValueOf(const std::string& name) const {
    return slots_.at(name).value;
  }
  const proto::TensorType& TypeOf(const std::string& name) const {
    return slots_.at(name).value.type();
  }
  rp::Instruction& LastInstruction() { return steps_.back().instruction; }

  // A new slot for `v` in `space`; its buffer id is the next one.
  Slot& AddSlot(const std::string& name, const proto::Value& v, rp::MemorySpace space,
                const std::string& where);
  // A slot in SBUF for every output of `n`; their names in order.
  std::vector<std::string> AddOutputSlots(const proto::Node& n, const std::string& where);
  // `name` is a view of `of`: its own type, `of`'s bytes and buffer.
  void Alias(const std::string& name, const proto::Value& v, const std::string& of);
  // `name` is `v`'s contiguous elements inside `of` (an SBUF slot, or a
  // part of one), from element `first` of `of`: a buffer of its own over
  // those bytes, so a step reads or writes that part in place (a matmul
  // tile's rows, a contiguous view).
  void AddPart(const std::string& name, const proto::Value& v, const std::string& of,
               std::int64_t first, const std::string& where);
  // The slot that owns `name`'s bytes.
  std::string Root(const std::string& name) const;
  // Whether `names` holds the planned slot `whole` or a part of it.
  bool Touches(const std::vector<std::string>& names, const std::string& whole) const;
  // The slot memory planning sees for `name`: its Root, or the slot a part
  // lies in.
  const std::string& Planned(const std::string& name) const;
  // A graph input or constant, in HBM as "hbm:NAME".
  void AddHbm(const proto::Value& v, const char* kind);
  // The on-chip copy of a value, loading it from HBM the first time.
  std::string OnChip(const std::string& name);
  // A returned value, stored to HBM as "out:NAME".
  void Store(const std::string& name);

  // A DMA of `from`'s bytes into `to` (OP_LOAD, OP_STORE, OP_SPILL, OP_RELOAD).
  void Dma(rp::Op op, const std::string& from, const std::string& to,
           const std::string& source);
  // A step on `engine` over the elements of its first output; its cost
  // passes are the op's (device_ops.h), else `operands`, else one per read
  // (at least one). The caller sets the op's other fields on the returned
  // instruction.
  rp::Instruction& AddStep(rp::EngineKind engine, rp::Op op,
                           std::vector<std::string> reads,
                           std::vector<std::string> writes, const std::string& source,
                           int operands = -1);
  void Elementwise(rp::EngineKind engine, rp::Op op, std::vector<std::string> reads,
                   const std::string& write, const std::string& source);
  // A view of `from`'s contiguous elements (sizes, strides, offset) into
  // `to`: contiguous, or at `out_strides` and `out_offset` (a part of it).
  void StridedCopy(const std::string& from, const std::string& to,
                   const std::vector<std::int64_t>& sizes,
                   const std::vector<std::int64_t>& strides, std::int64_t offset,
                   const std::string& source,
                   const std::vector<std::int64_t>& out_strides = {},
                   std::int64_t out_offset = 0);
  // Every element of `to` set to `value`.
  void Fill(const std::string& to, double value, const std::string& source);
  // An operand of an elementwise op whose result is `out`, under numpy
  // broadcasting: itself when it has the result's elements, or (with
  // `may_repeat`) when the engines' repetition of a shorter operand gives
  // the broadcast (its shape, without leading 1s, ends the result's: a
  // bias); otherwise a strided copy expanding it to the result's shape.
  std::string Broadcast(const std::string& name, const proto::Value& out, bool may_repeat,
                        const std::string& where, const std::string& source);
  // out = lhs x rhs (+ bias) on the tensor engine, `dims.batch` products
  // when > 0: into PSUM (float32), then to SBUF (a copy, or the bias add).
  // A result larger than a quarter of PSUM is computed in tiles of rows (of
  // batches, for bmm), each through PSUM into its rows of the result.
  void Matmul(const std::string& lhs, const std::string& rhs, const proto::Value& out,
              const MatmulDims& dims, const std::string& where, const std::string& source,
              const std::string& bias = "");

 private:
  // A bmm whose one product's result exceeds a quarter of PSUM: each
  // product in tiles of rows, each an mm through PSUM into its rows of
  // `out` (already a slot).
  void MatmulProductRows(const std::string& lhs, const std::string& rhs,
                         const proto::Value& out, const MatmulDims& dims,
                         const std::string& where, const std::string& source);
  // One matmul through a PSUM buffer into `to` (an SBUF slot of `to_value`).
  void MatmulTile(const std::string& lhs, const std::string& rhs, const std::string& to,
                  const proto::Value& to_value, const MatmulDims& dims,
                  const std::string& bias, const std::string& where,
                  const std::string& source);

  const proto::Graph& g_;
  const runtime::DeviceSpec& device_;
  std::unordered_map<std::string, Slot> slots_;
  std::vector<std::string> order_;  // slots in creation order (buffer ids)
  std::vector<Step> steps_;
};

}  // namespace neuron::compiler
