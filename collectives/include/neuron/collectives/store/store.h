// The rendezvous key-value store shared by the launcher and the collectives.
//
// Semantics follow c10d::Store: Get waits for its key, Add treats the value as
// a decimal integer, CompareSet swaps only when the current value matches.
// Implementations: HashStore (in process), TcpStore (client of
// TcpStoreServer), PrefixStore (a namespace over another store).
//
// Usage:
//   HashStore store;
//   store.Set("addr/0", "10.0.0.1:4000");
//   std::string v = store.Get("addr/0", std::chrono::seconds(30));
//   std::int64_t n = store.Add("arrived", 1);
//   store.Wait({"addr/0", "addr/1"}, std::chrono::seconds(30));
//
// Every blocking call takes a timeout and throws TimeoutError naming the
// missing keys when it expires. Thread-safety: every implementation may be
// called from several threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace neuron::collectives {

class Store {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultTimeout = std::chrono::minutes(5);
  // The longest wait a store honours: a longer timeout waits this long (a
  // deadline past the clock's range would otherwise wrap into the past and
  // time out at once); a negative one does not wait.
  static constexpr Duration kMaxTimeout = std::chrono::hours(24 * 365);
  static Duration Clamp(Duration timeout) {
    return timeout < Duration(0) ? Duration(0) : timeout > kMaxTimeout ? kMaxTimeout : timeout;
  }

  virtual ~Store() = default;

  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, then returns its value.
  virtual std::string Get(const std::string& key, Duration timeout) = 0;
  // Adds `delta` to the integer at `key` (0 when absent); returns the result.
  // A sum past the int64 range is refused (InvalidUsage), the value kept.
  virtual std::int64_t Add(const std::string& key, std::int64_t delta) = 0;
  // Sets `desired` if the key holds `expected` (or is absent and `expected`
  // is empty); returns the value the key holds afterwards (or `expected`
  // when the key is absent and `expected` is not empty), as c10d does.
  virtual std::string CompareSet(const std::string& key,
                                 const std::string& expected,
                                 const std::string& desired) = 0;
  // Waits until every key exists.
  virtual void Wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  // True when every key exists; never waits.
  virtual bool Check(const std::vector<std::string>& keys) = 0;
  // Removes `key`; true when it existed.
  virtual bool Delete(const std::string& key) = 0;
  virtual std::int64_t NumKeys() = 0;

  std::string Get(const std::string& key) { return Get(key, kDefaultTimeout); }
  void Wait(const std::vector<std::string>& keys) { Wait(keys, kDefaultTimeout); }
};

}  // namespace neuron::collectives
