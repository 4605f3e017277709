// The job's authenticated store (neuronrun's TcpStoreServer) as a
// c10d::Store, for torch.distributed's rendezvous under neuronrun: the
// env:// handler of torchneuron returns it instead of letting rank 0 open
// torch's TCPStore on MASTER_PORT, which any client could read and write.
//
// Usage:
//   if (auto store = neuron::c10d::ConnectJobStore(std::chrono::minutes(30))) {
//     store->set("key", "value");           // one authenticated connection
//   }
//
// Errors: a timeout or a refused secret throws c10::DistStoreError (what
// torch's own stores throw), with the message of the neuron error.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "neuron/collectives/store/tcp_store.h"

namespace neuron::c10d {

class JobStore : public ::c10d::Store {
 public:
  // Connects to the server and authenticates with `options.secret`.
  JobStore(collectives::TcpStoreOptions options, std::chrono::milliseconds timeout);

  // A second connection to the same server (c10d's thread-safe copy).
  c10::intrusive_ptr<::c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits up to the store's timeout for `key`.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  std::string endpoint() const { return store_->endpoint(); }

 private:
  collectives::TcpStoreOptions options_;
  std::unique_ptr<collectives::TcpStore> store_;
};

// The job's store when this process runs under neuronrun (NEURON_STORE_ENDPOINT
// and NEURON_JOB_SECRET, read through the configuration registry), else null.
c10::intrusive_ptr<JobStore> ConnectJobStore(std::chrono::milliseconds timeout);

}  // namespace neuron::c10d
