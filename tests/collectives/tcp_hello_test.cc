// The TCP transport's setup handshake (collectives/src/transport/tcp_hello.h).
#include "transport/tcp_hello.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "neuron/runtime/error.h"

namespace neuron::collectives::transport::detail {
namespace {

using namespace std::chrono_literals;

// A listener on loopback and its port.
int Listen(std::uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// A connected client socket to `port` on loopback.
int Connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Out of file descriptors, a rank cannot accept its peers: an IoError that
// says so at once, not a loop over the ever-readable listener until the
// setup timeout. (In a child: the descriptor limit is the process's.)
TEST(TcpHello, OutOfFileDescriptorsIsAnErrorNotABusyLoop) {
  std::uint16_t port = 0;
  const int listener = Listen(&port);
  const int peer = Connect(port);
  const pid_t child = ::fork();
  if (child == 0) {  // exit code: 0 the error, 1 no error, 2 another error
    const rlimit few{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &few);
    while (::dup(0) >= 0) {
    }
    std::vector<int> sockets(2, -1);
    try {
      AcceptPeers(listener, 0, "token", std::chrono::steady_clock::now() + 30s, sockets);
      ::_exit(1);
    } catch (const IoError& e) {
      ::_exit(std::string(e.what()).find("rank 0 cannot accept its peers' connections") !=
                      std::string::npos
                  ? 0
                  : 2);
    } catch (...) {
      ::_exit(2);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  ::close(peer);
  ::close(listener);
}

std::size_t OpenDescriptors() {
  return static_cast<std::size_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                    std::filesystem::directory_iterator{}));
}

// A flood test queues all its connections before the setup accepts any:
// the listen queue must hold them (net.core.somaxconn caps the backlog).
bool ListenQueueHolds(int connections) {
  std::ifstream f("/proc/sys/net/core/somaxconn");
  int cap = 0;
  return (f >> cap) && cap >= connections;
}

void SendHello(int fd, int rank) {
  Hello hello{};
  hello.rank = rank;
  std::memcpy(hello.token, "token", 5);
  ASSERT_EQ(::send(fd, &hello, sizeof(hello), 0), static_cast<ssize_t>(sizeof(hello)));
}

// More silent connections than a rank keeps waiting (64), queued before
// or after its peer's: the peer is taken, every stranger is closed, and
// the setup ends at once.
TEST(TcpHello, APeerAmongAFloodOfSilentConnectionsIsTaken) {
  constexpr int kStrangers = 150;
  if (!ListenQueueHolds(kStrangers + 1))
    GTEST_SKIP() << "net.core.somaxconn is too small";
  for (const bool peer_first : {true, false}) {
    SCOPED_TRACE(peer_first ? "the peer before the flood" : "the peer after the flood");
    std::uint16_t port = 0;
    const int listener = Listen(&port);
    ASSERT_EQ(::listen(listener, kStrangers + 1), 0);
    std::vector<int> clients;
    auto peer = [&] {
      clients.push_back(Connect(port));
      SendHello(clients.back(), 1);
    };
    if (peer_first) peer();
    for (int i = 0; i < kStrangers; ++i) clients.push_back(Connect(port));
    if (!peer_first) peer();
    const std::size_t before = OpenDescriptors();
    std::vector<int> sockets(2, -1);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(AcceptPeers(listener, 0, "token", start + 5s, sockets));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    EXPECT_GE(sockets[1], 0);
    EXPECT_EQ(OpenDescriptors(), before + 1);  // the peer's socket; no stranger's
    if (sockets[1] >= 0) ::close(sockets[1]);
    for (int fd : clients) ::close(fd);
    ::close(listener);
  }
}

// With 64 waiting, a newcomer makes room: the oldest is read a last time,
// so a peer whose hello arrived meanwhile is taken; a silent oldest is
// closed.
TEST(TcpHello, TheOldestWaitingIsReadALastTimeBeforeItIsDropped) {
  constexpr int kWaiting = static_cast<int>(Handshakes::kMaxPending);
  if (!ListenQueueHolds(kWaiting + 2)) GTEST_SKIP() << "net.core.somaxconn is too small";
  std::uint16_t port = 0;
  const int listener = Listen(&port);
  ASSERT_EQ(::listen(listener, kWaiting + 2), 0);
  ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);
  std::vector<int> clients{Connect(port)};  // the peer, first
  for (int i = 0; i < kWaiting; ++i) clients.push_back(Connect(port));
  std::vector<int> sockets(2, -1);
  Handshakes shakes(listener, 0, "token", sockets);
  for (int i = 0; i < kWaiting; ++i) ASSERT_TRUE(shakes.AcceptOne());
  ASSERT_EQ(shakes.pending().size(), Handshakes::kMaxPending);
  SendHello(clients[0], 1);           // after its last read in a poll round
  std::this_thread::sleep_for(50ms);  // on its way over loopback
  ASSERT_TRUE(shakes.AcceptOne());    // the 65th
  EXPECT_EQ(shakes.expected(), 0);
  EXPECT_GE(sockets[1], 0);
  EXPECT_EQ(shakes.pending().size(), Handshakes::kMaxPending);
  // Full again: the next newcomer drops the oldest stranger, silent.
  clients.push_back(Connect(port));
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(shakes.AcceptOne());
  EXPECT_EQ(shakes.pending().size(), Handshakes::kMaxPending);
  char byte = 0;
  EXPECT_EQ(::recv(clients[1], &byte, 1, 0), 0) << "the oldest stranger is closed";
  if (sockets[1] >= 0) ::close(sockets[1]);
  for (int fd : clients) ::close(fd);
  ::close(listener);
}

}  // namespace
}  // namespace neuron::collectives::transport::detail
