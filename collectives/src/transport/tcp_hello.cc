#include "tcp_hello.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives::transport::detail {

namespace {

using Clock = std::chrono::steady_clock;

// Connections that have not said hello yet; beyond this many the oldest is
// dropped (a flood of strangers cannot exhaust the file descriptors).
constexpr std::size_t kMaxPending = 64;

struct Pending {
  int fd;
  Hello hello;
  std::size_t got;
};

// Reads what `p` has sent; true while it may still complete its hello.
bool ReadSome(Pending& p) {
  while (p.got < sizeof(Hello)) {
    const ssize_t r =
        ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (r <= 0) return false;
    p.got += static_cast<std::size_t>(r);
  }
  return true;
}

bool Valid(const Hello& hello, const std::string& token, int rank,
           const std::vector<int>& sockets) {
  std::string padded = token;
  padded.resize(sizeof(hello.token), '\0');
  return auth::ConstantTimeEqual(std::string(hello.token, sizeof(hello.token)), padded) &&
         hello.rank > rank && hello.rank < static_cast<int>(sockets.size()) &&
         sockets[hello.rank] < 0;
}

// Accepts one connection into `pending`; false when there was none.
bool AcceptOne(int listener, int rank, std::vector<Pending>& pending) {
  const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      throw IoError(
          StrCat("tcp transport: rank ", rank,
                 " cannot accept its peers' connections: ", std::strerror(errno)));
    }
    return false;  // EAGAIN, EINTR, ECONNABORTED, a network error: try again
  }
  if (pending.size() == kMaxPending) {
    ::close(pending.front().fd);
    pending.erase(pending.begin());
  }
  pending.push_back({fd, Hello{}, 0});
  return true;
}

}  // namespace

void AcceptPeers(int listener, int rank, const std::string& token,
                 Clock::time_point give_up, std::vector<int>& sockets) {
  int expected = static_cast<int>(sockets.size()) - 1 - rank;
  ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);
  std::vector<Pending> pending;
  auto close_pending = [&] {
    for (const Pending& p : pending) ::close(p.fd);
  };
  try {
    while (expected > 0) {
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
      if (left.count() <= 0) {
        throw TimeoutError(StrCat("tcp transport: rank ", rank, " still waits for ",
                                  expected, " higher ranks to connect"));
      }
      if (::poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1) < 0) {
        if (errno == EINTR) continue;
        throw IoError(StrCat("tcp transport: rank ", rank,
                             " cannot wait for its peers: ", std::strerror(errno)));
      }
      // Hellos first (indices shift once a connection is accepted).
      for (std::size_t i = fds.size() - 1; i >= 1; --i) {
        if (fds[i].revents == 0) continue;
        Pending& p = pending[i - 1];
        const bool alive = ReadSome(p);
        if (alive && p.got < sizeof(Hello)) continue;
        if (alive && Valid(p.hello, token, rank, sockets)) {
          sockets[p.hello.rank] = p.fd;
          --expected;
        } else {
          ::close(p.fd);  // a stranger, garbage, or a peer that hung up
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 1));
      }
      if (fds[0].revents != 0) {
        while (AcceptOne(listener, rank, pending)) {
        }
      }
    }
  } catch (...) {
    close_pending();
    throw;
  }
  close_pending();
}

}  // namespace neuron::collectives::transport::detail
