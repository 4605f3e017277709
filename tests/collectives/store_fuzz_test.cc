// Feeds the TCP store server garbage: random bytes, oversized frames,
// malformed protobufs before and after the handshake. The server must refuse
// each without crashing and keep serving honest clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "neuron/collectives/store/tcp_store.h"
#include "neuron/collectives/store/tcp_store_server.h"

namespace neuron::collectives {
namespace {

using namespace std::chrono_literals;

// Connects, sends `bytes`, reads whatever comes back until the server closes
// the connection or 2 s pass; returns true when the server closed it.
bool SendRaw(std::uint16_t port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ssize_t ignored = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  (void)ignored;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[4096];
  bool closed = false;
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      closed = true;
      break;
    }
    if (n < 0) break;  // timeout: the server is still waiting for more
  }
  ::close(fd);
  return closed;
}

std::string Frame(const std::string& body) {
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string f = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                   static_cast<char>(n >> 8), static_cast<char>(n)};
  return f + body;
}

TEST(StoreServerFuzz, GarbageNeverCrashesTheServer) {
  TcpStoreServerOptions o;
  o.secret = "fuzz-secret";
  o.max_message_bytes = 1 << 16;
  o.handshake_timeout = 500ms;
  o.log = [](const std::string&) {};
  TcpStoreServer server(o);

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(1, 300);
  for (int round = 0; round < 40; ++round) {
    std::string junk(length(rng), '\0');
    for (auto& c : junk) c = static_cast<char>(byte(rng));
    SendRaw(server.port(), round % 2 == 0 ? junk : Frame(junk));
  }
  // An oversized frame is refused at once, before its body arrives.
  EXPECT_TRUE(SendRaw(server.port(), std::string("\x7f\xff\xff\xff", 4)));
  // A client that says nothing is dropped after the handshake timeout.
  EXPECT_TRUE(SendRaw(server.port(), ""));

  EXPECT_GE(server.refused_count(), 40u);
  TcpStoreOptions c;
  c.port = server.port();
  c.secret = "fuzz-secret";
  TcpStore honest(c);
  honest.Set("still", "alive");
  EXPECT_EQ(honest.Get("still", 1s), "alive");
}

}  // namespace
}  // namespace neuron::collectives
