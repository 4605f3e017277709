// The CPU fallbacks the "neuron" device ran while a fallback report was
// recording (torch.neuron.fallback_report): per operator and the user's
// source line that dispatched it, the count and the modelled cost.
//
// Usage:
//   FallbackReport::SetSiteFunction(&PythonUserSite);  // the Python bindings
//   FallbackReport::Start();                            // nests: a count
//   ... Charge() calls FallbackReport::Add for each kind "fallback" op ...
//   std::vector<FallbackRow> rows = FallbackReport::Rows();
//   FallbackReport::Stop();
//
// Rows accumulate over the process's life, only while at least one report
// records; a report takes the difference of two Rows() snapshots. Off (no
// report), the cost to an eager op is one relaxed atomic load (Recording()).
// Thread-safe. The site function runs without the report's lock held (it
// takes the Python GIL).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace neuron::aten {

// Where an operation was dispatched from: a file and line, or a file such as
// "<no Python frame>" and line 0.
struct FallbackSite {
  std::string file;
  int line = 0;
};

struct FallbackRow {
  std::string op;    // e.g. "aten::sort.values_stable"
  std::string file;  // FallbackSite's
  int line = 0;
  std::uint64_t count = 0;
  double modelled_us = 0;  // the device model's total for these runs
};

class FallbackReport {
 public:
  using SiteFunction = FallbackSite (*)();

  static bool Recording() { return depth_.load(std::memory_order_relaxed) > 0; }
  static void Start();
  // InvalidUsage when no report is recording.
  static void Stop();
  // Where Add finds the source line; null: every site "<unknown>".
  static void SetSiteFunction(SiteFunction site);
  // One fallback run of `op` costing `modelled_us`; ignored when not recording.
  static void Add(const char* op, double modelled_us);
  static std::vector<FallbackRow> Rows();

 private:
  static std::atomic<int> depth_;
};

}  // namespace neuron::aten
