// The TCP store server: the launcher's rendezvous and the job's bootstrap
// store. Runs its own Boost.Asio event loop on one thread; every client must
// pass the HMAC handshake (store.proto) with the job's secret first.
//
// Usage:
//   TcpStoreServer server({.host = "127.0.0.1", .port = 0, .secret = s});
//   TcpStore client({.host = "127.0.0.1", .port = server.port(), .secret = s});
//
// Refused clients, oversized and malformed messages are logged through
// `log` (never with the secret) and their connection closed; the server
// keeps serving everyone else.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace neuron::collectives {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // interface to bind ("0.0.0.0" = all)
  std::uint16_t port = 0;          // 0 = any free port
  std::string secret;              // required
  std::size_t max_message_bytes = 64u << 20;
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  // Receives one line per noteworthy event; default: stderr.
  std::function<void(const std::string&)> log;
};

class TcpStoreServer {
 public:
  // Binds and starts serving; throws IoError naming host:port when the
  // address cannot be bound (e.g. "port 29500 is already in use").
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  std::uint16_t port() const;
  const std::string& host() const;
  // Clients refused so far (failed handshake, oversized or malformed message).
  std::size_t refused_count() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace neuron::collectives
