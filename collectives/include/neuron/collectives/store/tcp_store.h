// A Store client of TcpStoreServer. One connection, one request at a time
// (calls from several threads are serialized); use one TcpStore per thread
// that blocks in Wait/Get while others need the store.
//
// Usage:
//   TcpStore store({.host = "node0", .port = 29400, .secret = s,
//                   .connect_timeout = std::chrono::seconds(60)});
//   store.Set("node/1", info);
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "neuron/collectives/store/store.h"

namespace neuron::collectives {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string secret;
  // How long to keep retrying a server that is not up yet.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
  // Deadline of a call that does not wait for keys (Set, Add, ...).
  std::chrono::milliseconds call_timeout = std::chrono::seconds(60);
};

class TcpStore : public Store {
 public:
  using Store::Get;
  using Store::Wait;

  // Connects and authenticates. Throws TimeoutError when the server does not
  // answer within connect_timeout, RemoteError when it refuses the secret.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Duration timeout) override;
  std::int64_t Add(const std::string& key, std::int64_t delta) override;
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void Wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  bool Delete(const std::string& key) override;
  std::int64_t NumKeys() override;

  // When this connection closes for any reason (the process dies included),
  // the server sets `key` = `value`. Used to announce a lost agent.
  void SetOnClose(const std::string& key, const std::string& value);
  void ClearOnClose();

  std::string endpoint() const;

 private:
  class Connection;
  std::unique_ptr<Connection> connection_;
  std::mutex mutex_;
};

}  // namespace neuron::collectives
