#include "neuron/collectives/store/key_value_table.h"

#include <cerrno>
#include <cstdlib>

#include "neuron/runtime/error.h"

namespace neuron::collectives {

void KeyValueTable::Set(const std::string& key, const std::string& value) {
  data_[key] = value;
}

std::optional<std::string> KeyValueTable::Find(const std::string& key) const {
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::int64_t KeyValueTable::Add(const std::string& key, std::int64_t delta) {
  std::int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const std::string& text = it->second;
    char* end = nullptr;
    errno = 0;
    current = std::strtoll(text.c_str(), &end, 10);
    NEURON_CHECK(!text.empty() && *end == '\0' && errno == 0, "store add on key '",
                 key, "': its value is not an integer");
  }
  std::int64_t result = 0;
  NEURON_CHECK(!__builtin_add_overflow(current, delta, &result), "store add on key '", key,
               "': ", current, " + ", delta, " is past the int64 range");
  data_[key] = std::to_string(result);
  return result;
}

std::string KeyValueTable::CompareSet(const std::string& key,
                                      const std::string& expected,
                                      const std::string& desired) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;
    data_[key] = desired;
    return desired;
  }
  if (it->second == expected) it->second = desired;
  return it->second;
}

bool KeyValueTable::Delete(const std::string& key) { return data_.erase(key) > 0; }

bool KeyValueTable::ContainsAll(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.count(k) == 0) return false;
  }
  return true;
}

std::string KeyValueTable::Missing(const std::vector<std::string>& keys) const {
  std::string out;
  for (const auto& k : keys) {
    if (data_.count(k) != 0) continue;
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

}  // namespace neuron::collectives
