// The data and the operations of a store, without any waiting or locking:
// the one implementation of Set/Add/CompareSet semantics that HashStore and
// TcpStoreServer both use. Not thread-safe; the owner serializes access.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace neuron::collectives {

class KeyValueTable {
 public:
  void Set(const std::string& key, const std::string& value);
  std::optional<std::string> Find(const std::string& key) const;
  // Throws InvalidUsage when the current value is not a decimal integer.
  std::int64_t Add(const std::string& key, std::int64_t delta);
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired);
  bool Delete(const std::string& key);
  bool ContainsAll(const std::vector<std::string>& keys) const;
  // The keys of `keys` that are absent, joined with ", " (for messages).
  std::string Missing(const std::vector<std::string>& keys) const;
  std::int64_t size() const { return static_cast<std::int64_t>(data_.size()); }

 private:
  std::map<std::string, std::string> data_;
};

}  // namespace neuron::collectives
