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

using Pending = Handshakes::Pending;

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

}  // namespace

Handshakes::Handshakes(int listener, int rank, const std::string& token,
                       std::vector<int>& sockets)
    : listener_(listener),
      rank_(rank),
      token_(token),
      sockets_(sockets),
      expected_(static_cast<int>(sockets.size()) - 1 - rank) {}

Handshakes::~Handshakes() {
  for (const Pending& p : pending_) ::close(p.fd);
}

bool Handshakes::Settle(std::size_t i) {
  Pending& p = pending_[i];
  const bool alive = ReadSome(p);
  if (alive && p.got < sizeof(Hello)) return false;
  if (alive && Valid(p.hello)) {
    sockets_[p.hello.rank] = p.fd;
    --expected_;
  } else {
    ::close(p.fd);  // a stranger, garbage, or a peer that hung up
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  return true;
}

bool Handshakes::AcceptOne() {
  const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      throw IoError(
          StrCat("tcp transport: rank ", rank_,
                 " cannot accept its peers' connections: ", std::strerror(errno)));
    }
    return false;  // EAGAIN, EINTR, ECONNABORTED, a network error: try again
  }
  if (pending_.size() == kMaxPending && !Settle(0)) {
    ::close(pending_.front().fd);
    pending_.erase(pending_.begin());
  }
  pending_.push_back({fd, Hello{}, 0});
  return true;
}

bool Handshakes::Valid(const Hello& hello) const {
  std::string padded = token_;
  padded.resize(sizeof(hello.token), '\0');
  return auth::ConstantTimeEqual(std::string(hello.token, sizeof(hello.token)), padded) &&
         hello.rank > rank_ && hello.rank < static_cast<int>(sockets_.size()) &&
         sockets_[hello.rank] < 0;
}

void AcceptPeers(int listener, int rank, const std::string& token,
                 Clock::time_point give_up, std::vector<int>& sockets) {
  ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);
  Handshakes shakes(listener, rank, token, sockets);  // closes what is left pending
  while (shakes.expected() > 0) {
    std::vector<pollfd> fds{{listener, POLLIN, 0}};
    for (const Pending& p : shakes.pending()) fds.push_back({p.fd, POLLIN, 0});
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError(StrCat("tcp transport: rank ", rank, " still waits for ",
                                shakes.expected(), " higher ranks to connect"));
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1) < 0) {
      if (errno == EINTR) continue;
      throw IoError(StrCat("tcp transport: rank ", rank,
                           " cannot wait for its peers: ", std::strerror(errno)));
    }
    // Hellos first, from the back (a settled entry leaves `pending`).
    for (std::size_t i = fds.size() - 1; i >= 1; --i) {
      if (fds[i].revents != 0) shakes.Settle(i - 1);
    }
    // A bounded burst: a listener flooded without end cannot keep the loop
    // from the hellos and the deadline.
    if (fds[0].revents != 0) {
      for (std::size_t n = 0; n < Handshakes::kMaxPending && shakes.AcceptOne(); ++n) {
      }
    }
  }
}

}  // namespace neuron::collectives::transport::detail
