// The TCP transport's setup handshake (collectives/src/transport/tcp_hello.h).
#include "transport/tcp_hello.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
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

// Out of file descriptors, a rank cannot accept its peers: an IoError that
// says so at once, not a loop over the ever-readable listener until the
// setup timeout. (In a child: the descriptor limit is the process's.)
TEST(TcpHello, OutOfFileDescriptorsIsAnErrorNotABusyLoop) {
  std::uint16_t port = 0;
  const int listener = Listen(&port);
  const int peer = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(peer, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
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

}  // namespace
}  // namespace neuron::collectives::transport::detail
