#include "neuron/aten/fallback_report.h"

#include <map>
#include <mutex>
#include <tuple>

#include "neuron/runtime/error.h"

namespace neuron::aten {
namespace {

struct Totals {
  std::uint64_t count = 0;
  double modelled_us = 0;
};

using Key = std::tuple<std::string, std::string, int>;  // op, file, line

struct State {
  std::mutex mutex;
  std::map<Key, Totals> rows;
  std::atomic<FallbackReport::SiteFunction> site{nullptr};
};

State& Get() {
  static State* state = new State();  // lives past exit: ops may run during teardown
  return *state;
}

}  // namespace

std::atomic<int> FallbackReport::depth_{0};

void FallbackReport::Start() { depth_.fetch_add(1); }

void FallbackReport::Stop() {
  int depth = depth_.load();
  do {
    NEURON_CHECK(depth > 0, "fallback report: Stop() without a recording report");
  } while (!depth_.compare_exchange_weak(depth, depth - 1));
}

void FallbackReport::SetSiteFunction(SiteFunction site) { Get().site.store(site); }

void FallbackReport::Add(const char* op, double modelled_us) {
  if (!Recording()) return;
  State& state = Get();
  const SiteFunction site_of = state.site.load();
  FallbackSite site = site_of != nullptr ? site_of() : FallbackSite{"<unknown>", 0};
  std::lock_guard<std::mutex> lock(state.mutex);
  Totals& t = state.rows[Key(op, std::move(site.file), site.line)];
  ++t.count;
  t.modelled_us += modelled_us;
}

std::vector<FallbackRow> FallbackReport::Rows() {
  State& state = Get();
  std::lock_guard<std::mutex> lock(state.mutex);
  std::vector<FallbackRow> out;
  out.reserve(state.rows.size());
  for (const auto& [key, t] : state.rows) {
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), t.count, t.modelled_us});
  }
  return out;
}

}  // namespace neuron::aten
