// An in-process Store: ranks as threads share one HashStore (tests, the
// threaded multi-rank fixture). Waiting blocks on a condition variable.
#pragma once

#include <condition_variable>
#include <mutex>

#include "neuron/collectives/store/key_value_table.h"
#include "neuron/collectives/store/store.h"

namespace neuron::collectives {

class HashStore : public Store {
 public:
  using Store::Get;
  using Store::Wait;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Duration timeout) override;
  std::int64_t Add(const std::string& key, std::int64_t delta) override;
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void Wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  bool Delete(const std::string& key) override;
  std::int64_t NumKeys() override;

 private:
  // Waits with `lock` held until every key exists; throws TimeoutError.
  void WaitLocked(std::unique_lock<std::mutex>& lock,
                  const std::vector<std::string>& keys, Duration timeout);

  std::mutex mutex_;
  std::condition_variable changed_;
  KeyValueTable table_;
};

}  // namespace neuron::collectives
