// A collective as the hardware would run it: steps of concurrent transfers
// between ranks. A step ends when its slowest transfer does; the next step
// starts then (the algorithms modelled here are bulk-synchronous).
#pragma once

#include <vector>

namespace neuron::runtime {

struct Transfer {
  int src = 0;  // rank
  int dst = 0;  // rank
  double bytes = 0;
};

struct Step {
  std::vector<Transfer> transfers;
};

struct Schedule {
  // "ring", "mesh", "rdh", "recursive_doubling", ...: a string literal (it
  // lives as long as the process, so costs and records hold it as is).
  const char* algorithm = "";
  std::vector<Step> steps;
};

}  // namespace neuron::runtime
