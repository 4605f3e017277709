// The TCP transport's setup handshake: a higher rank connects to a lower
// one and says hello (its rank and the group's token); the lower one
// accepts its peers' connections with AcceptPeers.
#pragma once

#include <chrono>
#include <cstddef>
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

// The connections of one AcceptPeers call: accepted ones waiting for their
// hello (at most kMaxPending, so a flood of strangers cannot exhaust the
// file descriptors), and the peers' sockets as their hellos arrive. Closes
// what is still waiting when destroyed.
class Handshakes {
 public:
  static constexpr std::size_t kMaxPending = 64;

  struct Pending {
    int fd;
    Hello hello;
    std::size_t got;  // bytes of `hello` read so far
  };

  Handshakes(int listener, int rank, const std::string& token, std::vector<int>& sockets);
  ~Handshakes();
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;

  // Peers whose hello has not arrived yet.
  int expected() const { return expected_; }
  const std::vector<Pending>& pending() const { return pending_; }

  // Reads pending()[i]'s hello; once it is whole (a peer's socket taken) or
  // can no longer be (closed), the entry leaves pending(): true then.
  bool Settle(std::size_t i);

  // Accepts one connection into pending(); false when there was none.
  // With kMaxPending waiting, the oldest is read a last time (its hello
  // may have arrived since it was last read) and dropped if still
  // incomplete: a connection waits until kMaxPending newer ones came.
  // IoError when accepting fails for good.
  bool AcceptOne();

 private:
  bool Valid(const Hello& hello) const;

  int listener_, rank_;
  std::string token_;
  std::vector<int>& sockets_;
  int expected_;
  std::vector<Pending> pending_;
};

}  // namespace neuron::collectives::transport::detail
