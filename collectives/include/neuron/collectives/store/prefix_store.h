// A namespace over another store, for sub-groups and rendezvous rounds:
// PrefixStore("round/3", base).Set("k", v) sets "round/3/k" in `base`.
#pragma once

#include <memory>

#include "neuron/collectives/store/store.h"

namespace neuron::collectives {

class PrefixStore : public Store {
 public:
  using Store::Get;
  using Store::Wait;

  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  void Set(const std::string& key, const std::string& value) override {
    base_->Set(prefix_ + key, value);
  }
  std::string Get(const std::string& key, Duration timeout) override {
    return base_->Get(prefix_ + key, timeout);
  }
  std::int64_t Add(const std::string& key, std::int64_t delta) override {
    return base_->Add(prefix_ + key, delta);
  }
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    return base_->CompareSet(prefix_ + key, expected, desired);
  }
  void Wait(const std::vector<std::string>& keys, Duration timeout) override {
    base_->Wait(Prefixed(keys), timeout);
  }
  bool Check(const std::vector<std::string>& keys) override {
    return base_->Check(Prefixed(keys));
  }
  bool Delete(const std::string& key) override { return base_->Delete(prefix_ + key); }
  // Counts every key of the base store: prefixes do not partition the count.
  std::int64_t NumKeys() override { return base_->NumKeys(); }

  const std::string& prefix() const { return prefix_; }
  Store& base() { return *base_; }

 private:
  std::vector<std::string> Prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace neuron::collectives
