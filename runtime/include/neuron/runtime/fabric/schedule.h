// A collective as the hardware would run it: steps of concurrent transfers
// between ranks. A step ends when its slowest transfer does; the next step
// starts then (the algorithms modelled here are bulk-synchronous).
#pragma once

#include <string>
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
  std::string algorithm;  // "ring", "mesh", "rdh", "recursive_doubling", ...
  std::vector<Step> steps;
};

}  // namespace neuron::runtime
