// Local TCP ports: finding a free one for MASTER_PORT, checking a given one.
#pragma once

#include <cstdint>

namespace neuron::launcher {

// A port the kernel reports free on every interface right now. Another
// process may take it before the rank binds it; ranks bind it at once.
std::uint16_t PickFreePort();

// True when `port` can be bound on every interface right now.
bool PortIsFree(std::uint16_t port);

}  // namespace neuron::launcher
