// The collectives' Store interface over a c10d::Store, so a process group
// bootstraps its communicator from whatever store torch.distributed gave it
// (TCPStore for env:// and tcp://, FileStore for file://, PrefixStore for
// subgroups).
//
// Usage:
//   auto store = std::make_shared<C10dStore>(c10d_store);
//   collectives::Communicator comm(store, rank, size);
//
// c10d errors become neuron errors: a wait that runs out of time throws
// TimeoutError naming the keys, anything else IoError.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "neuron/collectives/store/store.h"

namespace neuron::c10d {

class C10dStore : public collectives::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store)
      : store_(std::move(store)) {}

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Duration timeout) override;
  std::int64_t Add(const std::string& key, std::int64_t delta) override;
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void Wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  bool Delete(const std::string& key) override;
  std::int64_t NumKeys() override;
  using collectives::Store::Get;
  using collectives::Store::Wait;

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace neuron::c10d
