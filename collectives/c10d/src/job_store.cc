#include "neuron/c10d/job_store.h"

#include <torch/csrc/distributed/c10d/exception.h>

#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {
namespace {

std::string String(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Runs a call on the neuron store; its errors become c10d's store error.
template <typename F>
auto Translate(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const neuron::Error& e) {
    C10_THROW_ERROR(DistStoreError, StrCat("neuron job store ", what, ": ", e.what()));
  }
}

}  // namespace

JobStore::JobStore(collectives::TcpStoreOptions options, std::chrono::milliseconds timeout)
    : ::c10d::Store(timeout), options_(std::move(options)) {
  store_ = Translate("connect", [&] { return std::make_unique<collectives::TcpStore>(options_); });
}

c10::intrusive_ptr<::c10d::Store> JobStore::clone() {
  return c10::make_intrusive<JobStore>(options_, timeout_);
}

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Translate("set", [&] { store_->Set(key, String(value)); });
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key,
                                          const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return Bytes(Translate("compareSet",
                         [&] { return store_->CompareSet(key, String(expected), String(desired)); }));
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  return Bytes(Translate("get", [&] { return store_->Get(key, timeout_); }));
}

int64_t JobStore::add(const std::string& key, int64_t value) {
  return Translate("add", [&] { return store_->Add(key, value); });
}

bool JobStore::deleteKey(const std::string& key) {
  return Translate("deleteKey", [&] { return store_->Delete(key); });
}

bool JobStore::check(const std::vector<std::string>& keys) {
  return Translate("check", [&] { return store_->Check(keys); });
}

int64_t JobStore::getNumKeys() {
  return Translate("getNumKeys", [&] { return store_->NumKeys(); });
}

void JobStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void JobStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  Translate("wait", [&] { store_->Wait(keys, timeout); });
}

c10::intrusive_ptr<JobStore> ConnectJobStore(std::chrono::milliseconds timeout) {
  const auto& config = runtime::ConfigRegistry::Get();
  const auto endpoint = config.Find(runtime::ConfigKey::kStoreEndpoint);
  const auto secret = config.Find(runtime::ConfigKey::kJobSecret);
  if (!endpoint || !secret) return {};
  const auto colon = endpoint->rfind(':');
  const std::string port = colon == std::string::npos ? "" : endpoint->substr(colon + 1);
  NEURON_CHECK(colon != std::string::npos && colon > 0 && !port.empty() && port.size() <= 5 &&
                   port.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoi(port) > 0 && std::stoi(port) < 65536,
               "NEURON_STORE_ENDPOINT '", *endpoint, "' is not HOST:PORT");
  collectives::TcpStoreOptions options;
  options.host = endpoint->substr(0, colon);
  options.port = static_cast<std::uint16_t>(std::stoi(port));
  collectives::auth::CheckSecret(*secret, "$NEURON_JOB_SECRET");
  options.secret = *secret;
  options.connect_timeout = timeout;
  return c10::make_intrusive<JobStore>(std::move(options), timeout);
}

}  // namespace neuron::c10d
