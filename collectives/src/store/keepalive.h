// Store connections notice a peer that vanished without closing (a cut
// link, a powered-off node) within seconds, not at the kernel's two hours:
// TCP keepalive probes after 2 s of silence, every second, 3 unanswered
// ones end the connection; unacknowledged data gives up after 6 s. The
// store server then fires the lost client's set-on-close keys (an agent's
// loss ends the job), and a client's waits fail naming the store.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace neuron::collectives {

inline void EnableKeepAlive(int fd) {
  const int on = 1, idle = 2, interval = 1, count = 3;
  const unsigned user_timeout_ms = 6000;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

}  // namespace neuron::collectives
