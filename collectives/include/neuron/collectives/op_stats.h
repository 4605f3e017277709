// What each collective cost on the two clocks (docs/architecture.md): wall
// time on this CPU and modelled time on the simulated Trainium2 fabric.
#pragma once

#include <cstdint>
#include <string>

namespace neuron::collectives {

struct OpRecord {
  std::string op;              // "allreduce", ...
  std::uint64_t sequence = 0;
  double bytes = 0;            // nccl-tests size S (see collective_schedules.h)
  double wall_us = 0;          // this rank, handshake to completion
  double modelled_us = 0;      // the fabric model's duration
  std::string fabric_algorithm;
  double arrival_us = 0;       // simulated: when this rank reached the call
  double start_us = 0;         // simulated: the latest arrival over the ranks
  double end_us = 0;           // simulated: start + modelled duration
  double algbw_gbps = 0;       // bytes / modelled time
  double busbw_gbps = 0;       // algbw x nccl-tests factor
  // The direct allreduce read and wrote every rank's registered buffer in
  // place (transport/shared_buffers.h): nothing was staged.
  bool registered = false;
};

struct CommunicatorTotals {
  std::uint64_t operations = 0;
  double bytes = 0;
  double wall_us = 0;
  double modelled_us = 0;
  double waited_us = 0;        // simulated time this rank waited for the others
};

}  // namespace neuron::collectives
