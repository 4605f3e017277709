#include "neuron/c10d/store_adapter.h"

#include <utility>

#include "neuron/runtime/error.h"

namespace neuron::c10d {
namespace {

std::vector<std::uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string String(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }

std::string Join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// Runs a c10d store call, translating its errors. c10d reports a timeout as
// an error whose message says "Timeout", "timeout" or "timed out".
[[noreturn]] void Throw(const char* what, const std::string& keys,
                        const std::string& message) {
  const std::string full = StrCat("store ", what, " of [", keys, "]: ", message);
  if (message.find("imeout") != std::string::npos ||
      message.find("timed out") != std::string::npos) {
    throw TimeoutError(full);
  }
  throw IoError(full);
}

template <typename F>
auto Translate(const char* what, const std::string& keys, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    Throw(what, keys, e.what_without_backtrace());
  } catch (const std::exception& e) {  // HashStore throws std::system_error
    Throw(what, keys, e.what());
  }
}

}  // namespace

void C10dStore::Set(const std::string& key, const std::string& value) {
  Translate("set", key, [&] { store_->set(key, Bytes(value)); });
}

std::string C10dStore::Get(const std::string& key, Duration timeout) {
  Wait({key}, timeout);
  return Translate("get", key, [&] { return String(store_->get(key)); });
}

std::int64_t C10dStore::Add(const std::string& key, std::int64_t delta) {
  return Translate("add", key, [&] { return store_->add(key, delta); });
}

std::string C10dStore::CompareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  return Translate("compare-set", key, [&] {
    return String(store_->compareSet(key, Bytes(expected), Bytes(desired)));
  });
}

void C10dStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  Translate("wait", Join(keys), [&] { store_->wait(keys, timeout); });
}

bool C10dStore::Check(const std::vector<std::string>& keys) {
  return Translate("check", Join(keys), [&] { return store_->check(keys); });
}

bool C10dStore::Delete(const std::string& key) {
  return Translate("delete", key, [&] { return store_->deleteKey(key); });
}

std::int64_t C10dStore::NumKeys() {
  return Translate("count", "", [&] { return store_->getNumKeys(); });
}

}  // namespace neuron::c10d
