#include "lowering_context.h"

#include <algorithm>
#include <utility>

#include "lowering_util.h"
#include "neuron/compiler/device_dtypes.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {

Slot& LoweringContext::AddSlot(const std::string& name, const proto::Value& v,
                               rp::MemorySpace space, const std::string& where) {
  Slot s;
  s.value = v;
  s.space = space;
  s.dtype = DeviceElementType(v.type().dtype(), where);
  s.bytes =
      static_cast<std::uint64_t>(Elements(v.type())) * runtime::ElementBytes(s.dtype);
  s.buffer = static_cast<std::uint32_t>(slots_.size());
  order_.push_back(name);
  return slots_[name] = s;
}

std::vector<std::string> LoweringContext::AddOutputSlots(const proto::Node& n,
                                                         const std::string& where) {
  std::vector<std::string> names;
  for (const auto& out : n.outputs()) {
    AddSlot(out.name(), out, rp::SBUF, where);
    names.push_back(out.name());
  }
  return names;
}

void LoweringContext::Alias(const std::string& name, const proto::Value& v,
                            const std::string& of) {
  Slot s = slots_.at(of);
  s.value = v;
  s.alias_of = Root(of);
  slots_[name] = s;
}

void LoweringContext::AddPart(const std::string& name, const proto::Value& v,
                              const std::string& of, std::int64_t first,
                              const std::string& where) {
  // A part of a part is a part of the whole, further in.
  std::string root = Root(of);
  std::uint64_t offset = 0;
  if (!slots_.at(root).part_of.empty()) {
    offset = slots_.at(root).part_offset;
    root = slots_.at(root).part_of;
  }
  NEURON_CHECK(slots_.at(root).space == rp::SBUF, where, ": a part of %", of,
               " must lie in an SBUF value");
  Slot& part = AddSlot(name, v, rp::SBUF, where);
  const Slot& whole = slots_.at(root);
  part.part_of = root;
  part.part_offset =
      offset + static_cast<std::uint64_t>(first) * runtime::ElementBytes(part.dtype);
  NEURON_CHECK(part.dtype == whole.dtype && part.part_offset + part.bytes <= whole.bytes,
               where, ": %", name, " does not lie inside %", of);
}

const std::string& LoweringContext::Planned(const std::string& name) const {
  const Slot& s = slots_.at(name);
  return s.part_of.empty() ? name : s.part_of;
}

bool LoweringContext::Touches(const std::vector<std::string>& names,
                              const std::string& whole) const {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return Planned(n) == whole; });
}

std::string LoweringContext::Root(const std::string& name) const {
  const std::string& of = slots_.at(name).alias_of;
  return of.empty() ? name : of;
}

void LoweringContext::AddHbm(const proto::Value& v, const char* kind) {
  AddSlot("hbm:" + v.name(), v, rp::HBM,
          StrCat("graph ", g_.name(), ": ", kind, " %", v.name()));
}

std::string LoweringContext::OnChip(const std::string& name) {
  if (slots_.count(name)) return name;
  const Slot& hbm = slots_.at("hbm:" + name);
  AddSlot(name, hbm.value, rp::SBUF, "load");
  Dma(rp::OP_LOAD, "hbm:" + name, name, "load %" + name);
  return name;
}

void LoweringContext::Store(const std::string& name) {
  proto::Value v =
      slots_.count(name) ? slots_.at(name).value : slots_.at("hbm:" + name).value;
  const std::string target = "out:" + name;
  if (slots_.count(target)) return;  // returned twice: one buffer
  AddSlot(target, v, rp::HBM, "output");
  Dma(rp::OP_STORE, slots_.count(name) ? name : "hbm:" + name, target, "return %" + name);
}

void LoweringContext::Dma(rp::Op op, const std::string& from, const std::string& to,
                          const std::string& source) {
  Step s;
  s.instruction.set_engine(rp::DMA);
  s.instruction.set_op(op);
  s.instruction.set_bytes(slots_.at(from).bytes);
  const auto& shape = slots_.at(from).value.type().shape();
  s.instruction.set_partitions(static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(shape.empty() ? 1 : shape[0], 1, 128)));
  s.instruction.set_source(source);
  s.reads = {from};
  s.writes = {to};
  steps_.push_back(std::move(s));
}

rp::Instruction& LoweringContext::AddStep(rp::EngineKind engine, rp::Op op,
                                          std::vector<std::string> reads,
                                          std::vector<std::string> writes,
                                          const std::string& source, int operands) {
  Step s;
  s.instruction.set_engine(engine);
  s.instruction.set_op(op);
  s.instruction.set_elements(Elements(slots_.at(writes.at(0)).value.type()));
  const runtime::DeviceOp* row = runtime::FindDeviceOp(op);
  NEURON_ASSERT(row != nullptr, "lowering made op ", static_cast<int>(op));
  s.instruction.set_operand_count(static_cast<std::uint32_t>(
      row->passes > 0 ? row->passes
      : operands >= 0 ? operands
                      : static_cast<int>(std::max<std::size_t>(reads.size(), 1))));
  s.instruction.set_source(source);
  s.reads = std::move(reads);
  s.writes = std::move(writes);
  steps_.push_back(std::move(s));
  return steps_.back().instruction;
}

void LoweringContext::Elementwise(rp::EngineKind engine, rp::Op op,
                                  std::vector<std::string> reads,
                                  const std::string& write, const std::string& source) {
  const int operands = static_cast<int>(reads.size());
  AddStep(engine, op, std::move(reads), {write}, source, operands);
}

void LoweringContext::StridedCopy(const std::string& from, const std::string& to,
                                  const std::vector<std::int64_t>& sizes,
                                  const std::vector<std::int64_t>& strides,
                                  std::int64_t offset, const std::string& source,
                                  const std::vector<std::int64_t>& out_strides,
                                  std::int64_t out_offset) {
  rp::Instruction& i = AddStep(rp::VECTOR, rp::OP_STRIDED_COPY, {from}, {to}, source);
  std::int64_t n = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    n *= sizes[d];
    i.add_view_sizes(sizes[d]);
    i.add_in_strides(strides[d]);
  }
  for (auto st : out_strides) i.add_out_strides(st);
  i.set_in_offset(offset);
  i.set_out_offset(out_offset);
  i.set_elements(n);  // the view's: a part of `to` when it is written in parts
}

void LoweringContext::Fill(const std::string& to, double value,
                           const std::string& source) {
  AddStep(rp::VECTOR, rp::OP_FILL, {}, {to}, source).set_scalar(value);
}

std::string LoweringContext::Broadcast(const std::string& name, const proto::Value& out,
                                       bool may_repeat, const std::string& where,
                                       const std::string& source) {
  const auto shape = Shape(slots_.at(name).value.type());
  const auto target = Shape(out.type());
  if (shape == target) return name;
  std::vector<std::int64_t> core = shape;
  while (!core.empty() && core.front() == 1) core.erase(core.begin());
  const bool suffix = core.size() <= target.size() &&
                      std::equal(core.begin(), core.end(), target.end() - core.size());
  if (suffix &&
      (may_repeat || Elements(slots_.at(name).value.type()) == Elements(out.type()))) {
    return name;
  }
  NEURON_CHECK(shape.size() <= target.size(), where, ": cannot broadcast [", Join(shape),
               "] to [", Join(target), "]");
  const auto strides = ContiguousStrides(shape);
  std::vector<std::int64_t> view(target.size(), 0);
  const std::size_t lead = target.size() - shape.size();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    NEURON_CHECK(shape[d] == target[lead + d] || shape[d] == 1, where,
                 ": cannot broadcast [", Join(shape), "] to [", Join(target), "]");
    view[lead + d] = shape[d] == 1 ? 0 : strides[d];
  }
  proto::Value expanded = slots_.at(name).value;
  expanded.set_name(name + ".to." + out.name());
  *expanded.mutable_type()->mutable_shape() = out.type().shape();
  if (!slots_.count(expanded.name())) {
    AddSlot(expanded.name(), expanded, rp::SBUF, where);
    StridedCopy(name, expanded.name(), target, view, 0, source);
  }
  return expanded.name();
}

void LoweringContext::Matmul(const std::string& lhs, const std::string& rhs,
                             const proto::Value& out, const MatmulDims& dims,
                             const std::string& where, const std::string& source,
                             const std::string& bias) {
  AddSlot(out.name(), out, rp::SBUF, where);
  if (!bias.empty()) {
    const std::int64_t nb = Elements(slots_.at(bias).value.type());
    NEURON_CHECK(nb > 0 && Elements(out.type()) % nb == 0, where,
                 ": the bias must be [N] or [M,N]");
  }
  const std::int64_t budget = static_cast<std::int64_t>(device_.PsumBytes() / 4);
  const std::int64_t items = std::max<std::int64_t>(dims.batch, 1);
  const std::int64_t row_bytes = dims.n * 4;
  if (items * dims.m * row_bytes <= budget) {
    MatmulTile(lhs, rhs, out.name(), out, dims, bias, where, source);
    return;
  }
  // Tiles: whole batches for bmm, rows for mm; a bmm whose one product
  // does not fit, rows of each product.
  const bool batched = dims.batch > 0;
  if (batched && dims.m * row_bytes > budget && row_bytes <= budget) {
    MatmulProductRows(lhs, rhs, out, dims, where, source);
    return;
  }
  const std::int64_t unit_bytes = batched ? dims.m * row_bytes : row_bytes;
  NEURON_CHECK(unit_bytes <= budget, where, ": one ", batched ? "product" : "row", " of ",
               unit_bytes, " bytes does not fit a quarter of PSUM (", budget, " bytes)");
  NEURON_CHECK(bias.empty() || Elements(slots_.at(bias).value.type()) == dims.n, where,
               ": a tiled matmul takes a bias of [N] only");
  const std::int64_t units = batched ? dims.batch : dims.m;
  const std::int64_t per_tile = std::max<std::int64_t>(1, budget / unit_bytes);
  for (std::int64_t first = 0, t = 0; first < units; first += per_tile, ++t) {
    const std::int64_t count = std::min(per_tile, units - first);
    const std::string tile = StrCat(out.name(), ".tile", t);
    // The operand slices: dim `d` of `from` from `first`, `count` long (the
    // rows of lhs for mm: its columns when stored transposed; the batches
    // of both for bmm).
    // Leading-dim slices are contiguous: parts, read in place.
    auto slice = [&](const std::string& from, std::size_t d, const std::string& name) {
      const auto shape = Shape(slots_.at(from).value.type());
      std::vector<std::int64_t> sizes = shape;
      sizes[d] = count;
      proto::Value v = slots_.at(from).value;
      v.set_name(name);
      v.mutable_type()->set_shape(static_cast<int>(d), count);
      const auto strides = ContiguousStrides(shape);
      if (d == 0 && slots_.at(Root(from)).space == rp::SBUF) {
        AddPart(name, v, from, first * strides[0], where);
      } else {
        AddSlot(name, v, rp::SBUF, where);
        StridedCopy(from, name, sizes, strides, first * strides[d], source);
      }
      return name;
    };
    const std::string a =
        slice(lhs, !batched && dims.transpose_lhs ? 1 : 0, tile + ".lhs");
    const std::string b = batched ? slice(rhs, 0, tile + ".rhs") : rhs;
    // The tile's rows of the result, written in place.
    proto::Value part = out;
    part.set_name(tile);
    part.mutable_type()->set_shape(0, count);
    AddPart(tile, part, out.name(), first * ContiguousStrides(Shape(out.type()))[0],
            where);
    MatmulDims piece = dims;
    (batched ? piece.batch : piece.m) = count;
    MatmulTile(a, b, tile, part, piece, bias, where, source);
  }
}

void LoweringContext::MatmulProductRows(const std::string& lhs, const std::string& rhs,
                                        const proto::Value& out, const MatmulDims& dims,
                                        const std::string& where, const std::string& source) {
  const std::int64_t budget = static_cast<std::int64_t>(device_.PsumBytes() / 4);
  const std::int64_t rows = std::max<std::int64_t>(1, budget / (dims.n * 4));
  // A contiguous [count, width] block of `from` at element `first`: a part
  // of it in SBUF (read or written in place), else a strided copy.
  auto block = [&](const std::string& from, const std::string& name, std::int64_t first,
                   std::int64_t count, std::int64_t width) {
    proto::Value v = TempValue(name, slots_.at(from).value.type().dtype(), {count, width});
    if (slots_.at(Root(from)).space == rp::SBUF) {
      AddPart(name, v, from, first, where);
    } else {
      AddSlot(name, v, rp::SBUF, where);
      StridedCopy(from, name, {count * width}, {1}, first, source);
    }
    return name;
  };
  for (std::int64_t b = 0; b < dims.batch; ++b) {
    // rhs [k, n] (or [n, k] stored transposed): the whole product's.
    const std::string r = block(rhs, StrCat(out.name(), ".b", b, ".rhs"),
                                b * dims.k * dims.n, dims.transpose_rhs ? dims.n : dims.k,
                                dims.transpose_rhs ? dims.k : dims.n);
    for (std::int64_t first = 0; first < dims.m; first += rows) {
      const std::int64_t count = std::min(rows, dims.m - first);
      const std::string tile = StrCat(out.name(), ".b", b, ".rows", first);
      std::string l;
      if (dims.transpose_lhs) {  // stored [k, m]: the rows are columns, copied out
        l = tile + ".lhs";
        AddSlot(l, TempValue(l, slots_.at(lhs).value.type().dtype(), {dims.k, count}),
                rp::SBUF, where);
        StridedCopy(lhs, l, {dims.k, count}, {dims.m, 1}, b * dims.k * dims.m + first,
                    source);
      } else {
        l = block(lhs, tile + ".lhs", (b * dims.m + first) * dims.k, count, dims.k);
      }
      proto::Value part = TempValue(tile, out.type().dtype(), {count, dims.n});
      AddPart(tile, part, out.name(), (b * dims.m + first) * dims.n, where);
      MatmulDims piece = dims;
      piece.batch = 0;
      piece.m = count;
      MatmulTile(l, r, tile, part, piece, "", where, source);
    }
  }
}

void LoweringContext::MatmulTile(const std::string& lhs, const std::string& rhs,
                                 const std::string& to, const proto::Value& to_value,
                                 const MatmulDims& dims, const std::string& bias,
                                 const std::string& where, const std::string& source) {
  proto::Value acc = to_value;
  acc.set_name(to + ".psum");
  acc.mutable_type()->set_dtype("f32");
  AddSlot(acc.name(), acc, rp::PSUM, where);
  Step s;
  s.instruction.set_engine(rp::TENSOR);
  s.instruction.set_op(rp::OP_MATMUL);
  s.instruction.set_m(dims.m);
  s.instruction.set_k(dims.k);
  s.instruction.set_n(dims.n);
  s.instruction.set_batch(dims.batch);
  s.instruction.set_transpose_lhs(dims.transpose_lhs);
  s.instruction.set_transpose_rhs(dims.transpose_rhs);
  s.instruction.set_source(source);
  s.reads = {lhs, rhs};
  s.writes = {acc.name()};
  steps_.push_back(std::move(s));
  if (!bias.empty()) {
    Elementwise(rp::VECTOR, rp::OP_ADD, {acc.name(), bias}, to, source);
  } else {
    Elementwise(rp::VECTOR, rp::OP_COPY, {acc.name()}, to, source);
  }
}

}  // namespace neuron::compiler
