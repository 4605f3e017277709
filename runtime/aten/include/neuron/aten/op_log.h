// What the "neuron" device ran eagerly: one record per operation (its name,
// when it started on the rank's simulated compute clock, its modelled and
// wall time, its bytes and cost kind, the device memory allocated after it)
// and the totals, for
// torchneuron.fabric's records and Chrome trace.
//
// Usage:
//   OpLog& log = OpLog::Get();
//   log.Add({info.name.c_str(), start_us, modelled_us, wall_us, bytes, "matmul", allocated});
//   std::vector<EagerRecord> last = log.Records();   // the latest kCapacity
//   EagerTotals t = log.Totals();
//   log.Reset();
//
// Thread-safe (the autograd engine runs backward ops on its own threads).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace neuron::aten {

struct EagerRecord {
  const char* op = "";     // e.g. "aten::addmm" (an OpInfo's name: lives forever)
  double start_us = 0;     // compute clock when it was issued
  double modelled_us = 0;  // device model
  double wall_us = 0;      // this machine
  std::uint64_t bytes = 0; // read plus written
  const char* kind = "";   // runtime::EagerKind name
  std::uint64_t allocated = 0;  // the device's allocated bytes after it
};

struct EagerTotals {
  std::uint64_t operations = 0;
  double modelled_us = 0;
  double wall_us = 0;
  std::uint64_t bytes = 0;
};

class OpLog {
 public:
  static constexpr std::size_t kCapacity = 65536;
  static OpLog& Get();

  void Add(EagerRecord record);
  std::vector<EagerRecord> Records() const;
  EagerTotals Totals() const;
  void Reset();

 private:
  mutable std::mutex mutex_;
  std::deque<EagerRecord> records_;
  EagerTotals totals_;
};

}  // namespace neuron::aten
