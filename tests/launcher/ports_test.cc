// Port checks: a port with a listener is taken; one whose previous
// connections linger in TIME_WAIT is free again, as a restarted attempt's
// --master-port must be.
#include "ports.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace neuron::launcher {
namespace {

int Listen(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as TCPStore
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(fd, 4), 0);
  return fd;
}

TEST(Ports, AListenerTakesAPortButItsClosedConnectionsDoNot) {
  const std::uint16_t port = PickFreePort();
  const int listener = Listen(port);
  EXPECT_FALSE(PortIsFree(port));
  // A connection the server side closes first leaves that side's socket,
  // on `port`, in TIME_WAIT.
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int served = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(served, 0);
  ::close(served);
  ::close(listener);
  char byte;
  EXPECT_EQ(::read(client, &byte, 1), 0);  // the server's FIN arrived
  ::close(client);
  EXPECT_TRUE(PortIsFree(port));
}

}  // namespace
}  // namespace neuron::launcher
