#include "ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "neuron/runtime/error.h"

namespace neuron::launcher {

namespace {

// Binds a TCP socket on INADDR_ANY:port; returns the bound port, 0 on failure.
// With SO_REUSEADDR, as PyTorch's TCPStore binds: a port whose connections
// of a previous attempt linger in TIME_WAIT is free, one with a listener is not.
std::uint16_t TryBind(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw IoError(StrCat("socket failed: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  std::uint16_t bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

std::uint16_t PickFreePort() {
  const std::uint16_t port = TryBind(0);
  if (port == 0) throw IoError("no free TCP port on this host");
  return port;
}

bool PortIsFree(std::uint16_t port) { return TryBind(port) == port; }

}  // namespace neuron::launcher
