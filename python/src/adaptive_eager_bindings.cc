// Adaptive eager for Python (torchneuron/adaptive_eager.py): the region
// pricer that ties runtime/aten's region queue to the compiler (a region
// becomes IR text, region_ir.h, compiled through the process's compile
// cache like any torch.compile graph; the plan's modelled time is the
// region's), registered when the extension loads, and the switch and the
// statistics.
#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "bindings.h"
#include "neuron/aten/adaptive_eager.h"
#include "neuron/compiler/compiled_graph.h"
#include "region_ir.h"
#include "region_signature.h"

namespace py = pybind11;
namespace ad = neuron::aten::adaptive;

namespace {

// The IR graph's name: every region's, so a region's cache key depends
// only on what it computes.
constexpr const char* kGraphName = "adaptive_region";

class CompilerPricer final : public ad::RegionPricer {
 public:
  // Called under the queue's lock: `ops_` needs no lock of its own.
  bool Accepts(const neuron::aten::OpInfo& info,
               const std::vector<ad::Argument>& arguments,
               c10::ArrayRef<at::Tensor> results) const override {
    if (!neuron::python::RegionTakesRun(info, arguments, results)) return false;
    auto it = ops_.find(&info);  // OpInfos live forever: their address is their identity
    if (it == ops_.end())
      it = ops_.emplace(&info, neuron::python::RegionExpressesOp(info)).first;
    return it->second;
  }

  // A region met before in this process is priced from the tables of
  // priced regions: by its signature (region_signature.h: no IR written),
  // else by its IR text; a new one is compiled through the compile cache
  // (a disk hit when another process compiled it). A refusal (an op the IR
  // cannot write, a compiler limit) is a value, not an error, naming the
  // op when the message does (runtime/aten then prices the ops around it
  // as regions of their own), and is remembered as plans are.
  ad::Pricing Price(const ad::Region& region) override {
    const neuron::python::RegionSignature signature = neuron::python::SignatureOf(region);
    if (signature.valid) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (const auto it = by_signature_.find(signature); it != by_signature_.end()) {
        last_text_ = it->second.second;
        ad::Pricing p = it->second.first;
        if (p.priced) p.cache = "region table hit";
        return p;
      }
    }
    std::string text;  // empty while the IR is not written
    const ad::Pricing p = PriceText(region, &text);
    if (signature.valid && !text.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (by_signature_.size() == kTableEntries) by_signature_.clear();
      by_signature_.emplace(signature, std::make_pair(p, std::move(text)));
    }
    return p;
  }

  // Prices by the region's IR text, which it writes into *text.
  ad::Pricing PriceText(const ad::Region& region, std::string* text) {
    ad::Pricing p;
    try {
      *text = neuron::python::RegionToIr(region, kGraphName);
      std::lock_guard<std::mutex> lock(mutex_);
      last_text_ = *text;
      if (const auto it = priced_.find(*text); it != priced_.end()) {
        p.modelled_us = it->second;
        p.cache = "region table hit";
      } else if (const auto no = refused_.find(*text); no != refused_.end()) {
        return no->second;
      } else {
        const auto info = neuron::compiler::CompiledGraph::Compile(*text, "")->info();
        p.modelled_us = info.modelled_us;
        p.cache = info.cache_lookup;
        if (priced_.size() == kTableEntries) priced_.clear();
        priced_.emplace(*text, info.modelled_us);
      }
      p.priced = true;
    } catch (const std::exception& e) {
      p.error = e.what();
      p.refused_op = NamedOp(p.error);
      if (!text->empty()) {  // the compiler refused it: the same region is refused at
                             // once
        std::lock_guard<std::mutex> lock(mutex_);
        if (refused_.size() == kTableEntries) refused_.clear();
        refused_.emplace(*text, p);
      }
    }
    return p;
  }

  // The op an error names: region_ir.cc writes "region op N (...)" as each
  // IR line's source, which the compiler's messages quote, and names it so
  // in its own.
  static int NamedOp(const std::string& error) {
    const std::string mark = "region op ";
    const auto at = error.find(mark);
    if (at == std::string::npos) return -1;
    try {
      return std::stoi(error.substr(at + mark.size()));
    } catch (const std::exception&) {
      return -1;
    }
  }

  std::string last_text() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_text_;
  }

 private:
  // Bounds the table (a program whose regions never repeat): cleared
  // when full, as the regions of a training loop are few.
  static constexpr std::size_t kTableEntries = 1024;
  mutable std::mutex mutex_;
  std::string last_text_;                           // the IR of the last region priced
  std::unordered_map<std::string, double> priced_;  // IR text -> the plan's modelled us
  // IR text -> the compiler's refusal.
  std::unordered_map<std::string, ad::Pricing> refused_;
  // Signature -> its pricing and IR text.
  std::unordered_map<neuron::python::RegionSignature, std::pair<ad::Pricing, std::string>,
                     neuron::python::RegionSignatureHash>
      by_signature_;
  mutable std::unordered_map<const neuron::aten::OpInfo*, bool> ops_;  // Accepts, by op
};

CompilerPricer* pricer =
    nullptr;  // owned by runtime/aten's region queue, which never drops it

py::dict Stats() {
  const ad::Stats s = ad::GetStats();
  py::dict d;
  d["enabled"] = ad::Enabled();
  d["regions"] = s.regions;
  d["by_reason"] = s.by_reason;
  d["ops"] = s.ops;
  d["pending_ops"] = s.pending_ops;
  d["cache_hits"] = s.cache_hits;
  d["cache_misses"] = s.cache_misses;
  d["refused"] = s.refused;
  d["kept_eager"] = s.kept_eager;
  d["last_refusal"] = s.last_refusal;
  d["eager_us"] = s.eager_us;
  d["fused_us"] = s.fused_us;
  d["saved_us"] = s.eager_us - s.fused_us;
  d["pricing_wall_us"] = s.pricing_wall_us;
  return d;
}

}  // namespace

void BindAdaptiveEager(py::module_& m) {
  auto owned = std::make_unique<CompilerPricer>();
  pricer = owned.get();
  ad::SetPricer(std::move(owned));
  m.def("_adaptive_eager_enabled", &ad::Enabled,
        "Whether adaptive eager is on (NEURON_ADAPTIVE_EAGER until switched).");
  m.def("_set_adaptive_eager", &ad::SetEnabled, py::arg("on"),
        py::call_guard<py::gil_scoped_release>(),
        "Switches adaptive eager; returns the previous setting. Off flushes the open "
        "region.");
  m.def(
      "_adaptive_eager_flush",
      [](const std::string& reason) { ad::Flush(reason.c_str()); }, py::arg("reason"),
      py::call_guard<py::gil_scoped_release>(),
      "Prices and charges the open region (reason: its name in the statistics).");
  m.def("_adaptive_eager_stats", &Stats,
        "Adaptive eager's counters since the last reset.");
  m.def("_reset_adaptive_eager_stats", &ad::ResetStats);
  m.def(
      "_adaptive_eager_last_ir", [] { return pricer->last_text(); },
      "The IR text of the last region priced (\"\" before the first).");
}
