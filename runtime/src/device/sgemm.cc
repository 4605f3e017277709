// The process's sgemm and the registry of those it can run (sgemm.h).
#include "neuron/runtime/device/sgemm.h"

#include <cblas.h>

#include <atomic>
#include <mutex>

namespace neuron::runtime {
namespace {

void OpenBlasSgemm(const float* a, const float* b, float* c, std::int64_t batch,
                   std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate,
                   bool transpose_a, bool transpose_b) {
  for (std::int64_t p = 0; p < batch; ++p) {
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a + p * m * k,
                static_cast<blasint>(transpose_a ? m : k), b + p * k * n,
                static_cast<blasint>(transpose_b ? k : n), accumulate ? 1.0f : 0.0f,
                c + p * m * n, static_cast<blasint>(n));
  }
}

constexpr Sgemm kOpenBlas{"openblas", &OpenBlasSgemm};
std::atomic<const Sgemm*> current_sgemm{&kOpenBlas};

// Function-local: libraries register from their static initializers.
struct Registry {
  std::mutex mu;
  std::vector<const Sgemm*> sgemms{&kOpenBlas};
};
Registry& TheRegistry() {
  static Registry registry;
  return registry;
}

}  // namespace

const Sgemm& CurrentSgemm() { return *current_sgemm.load(); }

void SetSgemm(const Sgemm* sgemm) {
  current_sgemm.store(sgemm != nullptr ? sgemm : &kOpenBlas);
}

void RegisterSgemm(const Sgemm* sgemm) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Sgemm*& known : r.sgemms) {
    if (std::string_view(known->name) == sgemm->name) {
      known = sgemm;
      return;
    }
  }
  r.sgemms.push_back(sgemm);
}

const Sgemm* FindSgemm(std::string_view name) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Sgemm* s : r.sgemms) {
    if (name == s->name) return s;
  }
  return nullptr;
}

std::vector<std::string> SgemmNames() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const Sgemm* s : r.sgemms) names.emplace_back(s->name);
  return names;
}

}  // namespace neuron::runtime
