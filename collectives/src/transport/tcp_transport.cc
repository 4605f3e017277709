#include "neuron/collectives/transport/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"
#include "request_table.h"
#include "tcp_hello.h"

namespace neuron::collectives::transport {

namespace {

constexpr std::chrono::milliseconds kPollSlice(100);

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void Tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buffer = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
}

// Blocking exact write for the setup handshake (before non-blocking).
bool WriteExact(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// This host's address on the route to `host` (a UDP "connect" sends
// nothing); empty when `host` does not resolve or is a loopback address.
std::string AddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &result) != 0 || result == nullptr) return "";
  std::string out;
  const auto* target = reinterpret_cast<sockaddr_in*>(result->ai_addr);
  if ((ntohl(target->sin_addr.s_addr) >> 24) != 127) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (fd >= 0 && ::connect(fd, result->ai_addr, result->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
      out = text;
    }
    if (fd >= 0) ::close(fd);
  }
  ::freeaddrinfo(result);
  return out;
}

// The address peers reach this rank at: the given one; loopback when every
// rank is on this machine; else the address on the route to the job's store
// (neuronrun's agent on node 0, or MASTER_ADDR under mpirun and srun: right
// even with several interfaces or network namespaces); else the host
// name's; else loopback.
std::string HostAddress(const TcpOptions& o) {
  if (!o.address.empty()) return o.address;
  if (o.loopback) return "127.0.0.1";
  const auto& config = runtime::ConfigRegistry::Get();
  if (const auto endpoint = config.Find(runtime::ConfigKey::kStoreEndpoint)) {
    const std::string towards = AddressTowards(endpoint->substr(0, endpoint->rfind(':')));
    if (!towards.empty()) return towards;
  }
  if (const auto master = config.Find(runtime::ConfigKey::kMasterAddr)) {
    const std::string towards = AddressTowards(*master);
    if (!towards.empty()) return towards;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host, nullptr, &hints, &result) != 0 || result == nullptr) return "127.0.0.1";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr, text,
              sizeof(text));
  ::freeaddrinfo(result);
  return text;
}

}  // namespace

TcpTransport::TcpTransport(Store& store, int rank, int size, TcpOptions options)
    : store_(store), rank_(rank), size_(size), options_(std::move(options)),
      sockets_(size, -1), requests_(std::make_unique<RequestTable>(size)) {
  NEURON_CHECK(rank >= 0 && rank < size, "tcp transport: rank ", rank, " outside 0..", size - 1);
  const std::string address = HostAddress(options_);
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  NEURON_CHECK(::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) == 1,
               "tcp transport: '", address, "' is not an IPv4 address");
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener_, size) != 0) {
    const int e = errno;
    ::close(listener_);
    throw IoError(StrCat("tcp transport: cannot listen on ", address, ": ", std::strerror(e)));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string token = GroupToken();
  store_.Set("tcp/addr/" + std::to_string(rank), address + ":" + std::to_string(ntohs(addr.sin_port)));
  try {
    Connect(token);
  } catch (...) {
    for (int fd : sockets_) if (fd >= 0) ::close(fd);
    ::close(listener_);
    throw;
  }
  for (int fd : sockets_) {
    if (fd >= 0) SetNonBlocking(fd);
  }
}

// Without a secret, rank 0 publishes a random token in the store (the
// job's authenticated store under neuronrun). With one, it publishes only
// a random nonce and every rank derives the token as HMAC(secret, nonce):
// a reader of an unauthenticated store (torchrun's TCPStore) learns
// nothing that lets it in, and a token seen on the wire opens no other
// group.
std::string TcpTransport::GroupToken() {
  if (options_.secret.empty()) {
    if (rank_ == 0) store_.Set("tcp/token", auth::GenerateSecret().substr(0, 32));
    return store_.Get("tcp/token", options_.setup_timeout);
  }
  if (rank_ == 0) store_.Set("tcp/nonce", auth::GenerateSecret());
  const std::string nonce = store_.Get("tcp/nonce", options_.setup_timeout);
  return auth::Proof(options_.secret, kTokenLabel, nonce, "");
}

void TcpTransport::Connect(const std::string& token) {
  // Higher ranks connect to lower ones; each accepted connection says who it is.
  for (int peer = 0; peer < rank_; ++peer) {
    const std::string endpoint = store_.Get("tcp/addr/" + std::to_string(peer), options_.setup_timeout);
    const auto colon = endpoint.rfind(':');
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1))));
    ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(StrCat("tcp transport: rank ", rank_, " cannot connect to rank ", peer,
                           " at ", endpoint, ": ", std::strerror(e)));
    }
    Tune(fd);
    detail::Hello hello{rank_, {}};
    std::memcpy(hello.token, token.data(), std::min(token.size(), sizeof(hello.token)));
    if (!WriteExact(fd, &hello, sizeof(hello))) {
      ::close(fd);
      throw IoError(StrCat("tcp transport: rank ", peer, " hung up during setup"));
    }
    sockets_[peer] = fd;
  }
  detail::AcceptPeers(listener_, rank_, token, Clock::now() + options_.setup_timeout,
                      sockets_);
  for (int peer = rank_ + 1; peer < size_; ++peer) Tune(sockets_[peer]);
  ::close(listener_);
  listener_ = -1;
}

TcpTransport::~TcpTransport() {
  for (int fd : sockets_) if (fd >= 0) ::close(fd);
  if (listener_ >= 0) ::close(listener_);
}

RequestId TcpTransport::Isend(int peer, const void* data, std::size_t bytes) {
  return requests_->Post(peer, true, data, bytes);
}

RequestId TcpTransport::Irecv(int peer, void* data, std::size_t bytes) {
  return requests_->Post(peer, false, data, bytes);
}

void TcpTransport::PeerLost(int peer, const Label& what, const std::string& how) {
  // An aborting rank leaves its reason in the store before it hangs up;
  // give it a moment to land (the hang-up can overtake the store write).
  std::string reason;
  try {
    reason = store_.Get("tcp/abort", std::chrono::milliseconds(250));
  } catch (const std::exception&) {
    // No reason: the peer died or hung up on its own.
  }
  if (!reason.empty()) throw RemoteError(StrCat(what, " on rank ", rank_, " aborted: ", reason));
  // The first to see a peer go tells the others: a rank whose stream ends
  // because this one gives up then names the peer that went, not this rank.
  try {
    store_.CompareSet("tcp/abort", "", StrCat("rank ", peer, " ", how, " (seen by rank ", rank_, ")"));
  } catch (const std::exception&) {
    // The store is gone too: the error below still names the peer.
  }
  throw IoError(StrCat(what, ": rank ", peer, " ", how, "; rank ", rank_, " lost its stream"));
}

bool TcpTransport::ProgressSend(int peer, const Label& what) {
  bool moved = false;
  auto& queue = requests_->sends(peer);
  while (!queue.empty()) {
    RequestTable::Request& r = requests_->at(queue.front());
    if (peer == rank_) {
      loopback_.insert(loopback_.end(), r.data + r.done, r.data + r.bytes);
      r.done = r.bytes;
    }
    while (r.done < r.bytes) {
      const ssize_t n = ::send(sockets_[peer], r.data + r.done, r.bytes - r.done, MSG_NOSIGNAL);
      if (n > 0) {
        r.done += static_cast<std::size_t>(n);
        moved = true;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
      if (n < 0 && errno == EINTR) continue;
      PeerLost(peer, what, StrCat("closed its connection (", std::strerror(errno), ")"));
    }
    queue.pop_front();
    moved = true;
  }
  return moved;
}

bool TcpTransport::ProgressRecv(int peer, const Label& what) {
  bool moved = false;
  auto& queue = requests_->recvs(peer);
  while (!queue.empty()) {
    RequestTable::Request& r = requests_->at(queue.front());
    if (peer == rank_) {
      const std::size_t n = std::min(loopback_.size(), r.bytes - r.done);
      std::copy(loopback_.begin(), loopback_.begin() + static_cast<long>(n), r.data + r.done);
      loopback_.erase(loopback_.begin(), loopback_.begin() + static_cast<long>(n));
      r.done += n;
      moved = moved || n > 0;
      if (r.done < r.bytes) return moved;
    }
    while (r.done < r.bytes) {
      const ssize_t n = ::recv(sockets_[peer], r.data + r.done, r.bytes - r.done, 0);
      if (n > 0) {
        r.done += static_cast<std::size_t>(n);
        moved = true;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
      if (n < 0 && errno == EINTR) continue;
      PeerLost(peer, what, n == 0 ? "closed its connection" : std::strerror(errno));
    }
    queue.pop_front();
    moved = true;
  }
  return moved;
}

bool TcpTransport::Progress(const Label& what) {
  bool moved = false;
  for (int p = 0; p < size_; ++p) {
    if (!requests_->sends(p).empty()) moved |= ProgressSend(p, what);
    if (!requests_->recvs(p).empty()) moved |= ProgressRecv(p, what);
  }
  return moved;
}

void TcpTransport::Wait(const std::vector<RequestId>& ids, Deadline deadline,
                        const Label& what) {
  WaitAllOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

bool TcpTransport::TryWait(const std::vector<RequestId>& ids, Deadline deadline,
                           const Label& what) {
  return TryWaitAllOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

std::size_t TcpTransport::WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                                  const Label& what) {
  return WaitAnyOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

template <typename Done>
void TcpTransport::WaitUntil(Done done, const std::vector<RequestId>& ids, Deadline deadline,
                             const Label& what, bool* expired) {
  while (true) {
    Progress(what);
    if (done()) break;
    std::vector<pollfd> fds;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      short events = 0;
      if (!requests_->sends(p).empty()) events |= POLLOUT;
      if (!requests_->recvs(p).empty()) events |= POLLIN;
      if (events) fds.push_back({sockets_[p], events, 0});
    }
    const auto now = Clock::now();
    if (now >= deadline.At(now)) {
      if (expired != nullptr) {
        *expired = true;
        return;
      }
      throw TimeoutError(StrCat(what, " on rank ", rank_, " timed out; still pending: ",
                                requests_->Pending(ids)));
    }
    const auto slice = std::min<Clock::duration>(deadline.At(now) - now, kPollSlice);
    ::poll(fds.data(), fds.size(),
           static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(slice).count()) + 1);
  }
}

void TcpTransport::Abort(const std::string& reason) {
  // The reason first, so a peer that sees the hang-up can read it; the
  // hang-up happens whether or not the store is still there.
  try {
    store_.CompareSet("tcp/abort", "", reason);
  } catch (const std::exception&) {
    // Without the store the peers still see the hang-up, just not the reason.
  }
  for (int fd : sockets_) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

}  // namespace neuron::collectives::transport
