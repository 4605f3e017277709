#include "neuron/runtime/device/custom_kernels.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include <sstream>

#include "exec_custom.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const CustomKernel>> kernels;
};

Registry& Get() {
  static Registry* registry = new Registry();  // kept: callbacks may outlive statics
  return *registry;
}

std::shared_ptr<const CustomKernel> Find(const std::string& key) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto found = r.kernels.find(key);
  return found == r.kernels.end() ? nullptr : found->second;
}

}  // namespace

void RegisterCustomKernel(const std::string& key, CustomKernel kernel) {
  NEURON_CHECK(!key.empty() && kernel, "RegisterCustomKernel: a key and a kernel are needed");
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.kernels[key] = std::make_shared<const CustomKernel>(std::move(kernel));
}

bool HasCustomKernel(const std::string& key) { return Find(key) != nullptr; }

void RunCustomKernel(const std::string& key, const std::vector<KernelOperand>& inputs,
                     const std::vector<KernelOperand>& outputs, const std::string& what) {
  const auto kernel = Find(key);
  NEURON_CHECK(kernel != nullptr, what, ": custom kernel '", key,
               "' is not registered in this process (a torchneuron.nki kernel is "
               "registered when a graph calling it is compiled here)");
  (*kernel)(inputs, outputs);
}

void CheckCustomKernelInstruction(const proto::Instruction& i, const std::string& what) {
  NEURON_CHECK(!i.kernel().empty(), what, ": a custom kernel needs its kernel key");
  NEURON_CHECK(i.kernel_us() >= 0, what, ": kernel ", i.kernel(), " lasts ", i.kernel_us(),
               " us (< 0)");
  NEURON_CHECK(i.kernel_busy_us_size() == i.kernel_engines_size(), what, ": kernel ",
               i.kernel(), " has ", i.kernel_engines_size(), " engines and ",
               i.kernel_busy_us_size(), " busy times");
  const auto& engines = i.kernel_engines();
  NEURON_CHECK(std::find(engines.begin(), engines.end(), i.engine()) != engines.end(), what,
               ": kernel ", i.kernel(), " runs on ", proto::EngineKind_Name(i.engine()),
               ", which is not one of its engines");
  for (int k = 0; k < engines.size(); ++k) {
    NEURON_CHECK(engines[k] != proto::ENGINE_UNSPECIFIED && i.kernel_busy_us(k) >= 0 &&
                     i.kernel_busy_us(k) <= i.kernel_us() * (1 + 1e-9) + 1e-9,
                 what, ": kernel ", i.kernel(), ": engine ",
                 proto::EngineKind_Name(engines[k]), " busy ", i.kernel_busy_us(k),
                 " us of its ", i.kernel_us());
  }
}

namespace detail {

namespace {

std::vector<KernelOperand> Operands(const std::vector<Placed>& placed) {
  std::vector<KernelOperand> out;
  for (const Placed& p : placed) {
    out.push_back({p.buffer->dtype(),
                   {p.buffer->shape().begin(), p.buffer->shape().end()},
                   p.data,
                   static_cast<std::size_t>(p.buffer->bytes())});
  }
  return out;
}

}  // namespace

void RunCustom(const proto::Instruction& i, const std::vector<Placed>& in,
               const std::vector<Placed>& out, const What& what) {
  std::ostringstream where;
  where << what;
  RunCustomKernel(i.kernel(), Operands(in), Operands(out), where.str());
}

}  // namespace detail
}  // namespace neuron::runtime
