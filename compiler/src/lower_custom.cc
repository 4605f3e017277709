// A custom kernel node of the IR (nki.kernel: a torchneuron.nki kernel
// called in a compiled graph) as one OP_CUSTOM_KERNEL instruction: its
// inputs and outputs in HBM (an on-chip input stored there first; an
// output loaded by the steps that read it), lasting the kernel's own
// modelled time on the engines its schedule used (the node's attributes,
// which the frontend took from the kernel's schedule for these shapes).
//
//   %o: bf16[1,4,2048,64], %l: f32[1,4,2048] = nki.kernel(%q, %k, %v)
//       {kernel = "nki::flash_attention_forward@3f1c...", time_us = 301.6,
//        busy_tensor = 143.0, busy_vector = 276.0, ..., hbm_bytes = 6291456}
#include <string>
#include <utility>
#include <vector>

#include "lower_custom.h"
#include "lowering_util.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

// The engines a kernel may use, by attribute: busy_NAME = its busy us.
const std::pair<const char*, rp::EngineKind> kEngines[] = {
    {"busy_tensor", rp::TENSOR}, {"busy_vector", rp::VECTOR}, {"busy_scalar", rp::SCALAR},
    {"busy_gpsimd", rp::GPSIMD}, {"busy_dma", rp::DMA}};

// The instruction's timing fields from the node's attributes: the
// kernel's time and, per engine it used, its busy time; the instruction's
// own engine is the busiest one.
void SetTiming(const proto::Node& n, const std::string& where, rp::Instruction& i) {
  const proto::Attribute* key = Attr(n, "kernel");
  NEURON_CHECK(key != nullptr && key->value_case() == proto::Attribute::kS && !key->s().empty(),
               where, ": a custom kernel needs its kernel key (kernel = \"...\")");
  NEURON_CHECK(Attr(n, "time_us") != nullptr, where, ": custom kernel ", key->s(),
               " has no time_us");
  const double time_us = AttrNumber(n, "time_us", 0);
  NEURON_CHECK(time_us >= 0, where, ": custom kernel ", key->s(), " lasts ", time_us, " us");
  i.set_kernel(key->s());
  i.set_kernel_us(time_us);
  const std::int64_t bytes = AttrInt(n, "hbm_bytes", 0);
  NEURON_CHECK(bytes >= 0, where, ": custom kernel ", key->s(), " moves ", bytes, " HBM bytes");
  i.set_bytes(static_cast<std::uint64_t>(bytes));
  double busiest = -1;
  for (const auto& [name, engine] : kEngines) {
    if (Attr(n, name) == nullptr) continue;
    const double busy = AttrNumber(n, name, 0);
    NEURON_CHECK(busy >= 0 && busy <= time_us * (1 + 1e-9) + 1e-9, where, ": custom kernel ",
                 key->s(), ": ", name, " = ", busy, " is not within its ", time_us, " us");
    i.add_kernel_engines(engine);
    i.add_kernel_busy_us(busy);
    if (busy > busiest) {
      busiest = busy;
      i.set_engine(engine);
    }
  }
  NEURON_CHECK(busiest >= 0, where, ": custom kernel ", key->s(),
               " names no engine (busy_tensor, busy_vector, busy_scalar, busy_gpsimd, "
               "busy_dma)");
}

// `name` in HBM: a graph input, a constant or an earlier kernel's output
// as it is; an on-chip value stored to an HBM slot of its own first.
std::string InHbm(LoweringContext& cx, const std::string& name, const std::string& where) {
  const std::string hbm = "hbm:" + name;
  if (cx.Has(hbm)) return hbm;
  NEURON_CHECK(cx.Has(name), where, ": input %", name, " is not defined");
  cx.AddSlot(hbm, cx.ValueOf(name), rp::HBM, where);
  cx.Dma(rp::OP_STORE, name, hbm, "store %" + name + " for a custom kernel");
  return hbm;
}

}  // namespace

void LowerCustomKernel(LoweringContext& cx, const proto::Node& n, const std::string& where) {
  NEURON_CHECK(n.outputs_size() > 0, where, ": a custom kernel returns at least one tensor");
  Step s;
  s.instruction.set_op(rp::OP_CUSTOM_KERNEL);
  s.instruction.set_source(n.source().empty() ? n.op() : n.source());
  SetTiming(n, where, s.instruction);
  for (const auto& name : n.inputs()) s.reads.push_back(InHbm(cx, name, where));
  for (const auto& out : n.outputs()) {
    const std::string hbm = "hbm:" + out.name();
    NEURON_CHECK(!cx.Has(hbm) && !cx.Has(out.name()), where, ": output %", out.name(),
                 " is defined twice");
    cx.AddSlot(hbm, out, rp::HBM, where);
    s.writes.push_back(hbm);
  }
  cx.steps().push_back(std::move(s));
}

}  // namespace neuron::compiler
