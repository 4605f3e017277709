// The TCP transport's setup handshake: a higher rank connects to a lower
// one and says hello (its rank and the group's token); the lower one
// accepts its peers' connections with AcceptPeers.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace neuron::collectives::transport::detail {

struct Hello {
  std::int32_t rank;
  char token[32];
};

// Accepts on `listener` until sockets[p] is set for every p in (rank, size),
// as each peer's hello arrives: connections are read side by side (non-
// blocking), so one that stays silent, sends garbage or the wrong token
// holds up nobody and is closed. Throws TimeoutError naming how many peers
// never came by `give_up`, IoError when accepting fails for good (out of
// file descriptors). Accepted sockets are non-blocking.
void AcceptPeers(int listener, int rank, const std::string& token,
                 std::chrono::steady_clock::time_point give_up,
                 std::vector<int>& sockets);

}  // namespace neuron::collectives::transport::detail
