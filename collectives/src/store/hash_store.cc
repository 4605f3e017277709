#include "neuron/collectives/store/hash_store.h"

#include "neuron/runtime/error.h"

namespace neuron::collectives {

void HashStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.Set(key, value);
  }
  changed_.notify_all();
}

std::string HashStore::Get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, {key}, timeout);
  return *table_.Find(key);
}

std::int64_t HashStore::Add(const std::string& key, std::int64_t delta) {
  std::int64_t result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.Add(key, delta);
  }
  changed_.notify_all();
  return result;
}

std::string HashStore::CompareSet(const std::string& key,
                                  const std::string& expected,
                                  const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.CompareSet(key, expected, desired);
  }
  changed_.notify_all();
  return result;
}

void HashStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, keys, timeout);
}

bool HashStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.ContainsAll(keys);
}

bool HashStore::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.Delete(key);
}

std::int64_t HashStore::NumKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.size();
}

void HashStore::WaitLocked(std::unique_lock<std::mutex>& lock,
                           const std::vector<std::string>& keys,
                           Duration timeout) {
  timeout = Clamp(timeout);
  const bool ready = changed_.wait_for(
      lock, timeout, [&] { return table_.ContainsAll(keys); });
  if (!ready) {
    throw TimeoutError(StrCat("store wait timed out after ", timeout.count(),
                              " ms; missing keys: ", table_.Missing(keys)));
  }
}

}  // namespace neuron::collectives
