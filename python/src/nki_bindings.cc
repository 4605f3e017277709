// torchneuron._C's kernel-language support (torchneuron.nki): the device
// spec's on-chip figures, the device model's price of one engine
// instruction, a CPU view of a "neuron" tensor's memory, and charging a
// kernel run to the rank's compute clock as one eager operation, and the
// callbacks that run a kernel inside a compiled graph's plan
// (OP_CUSTOM_KERNEL). Thin: the cost model lives in neuron::runtime, the
// device in neuron::aten.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <set>
#include <string>

#include "bindings.h"
#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/host_views.h"
#include "neuron/aten/op_log.h"
#include "neuron/compiler/torch_tensors.h"
#include "neuron/runtime/device/custom_kernels.h"
#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace py = pybind11;
namespace nr = neuron::runtime;

namespace {

const nr::CostModel& Model() {
  static const nr::CostModel model(nr::DeviceSpec::FromEnvironment());
  return model;
}

nr::Engine EngineNamed(const std::string& name) {
  if (name == "vector") return nr::Engine::kVector;
  if (name == "scalar") return nr::Engine::kScalar;
  if (name == "gpsimd") return nr::Engine::kGpSimd;
  throw neuron::InvalidUsage("nki: no elementwise engine named '" + name +
                             "' (vector, scalar or gpsimd)");
}

// The on-chip figures a kernel is checked against (device.proto).
py::dict Spec() {
  const auto& s = Model().device().spec();
  py::dict d;
  d["name"] = s.name();
  d["partitions"] = s.sbuf().partitions();
  d["sbuf_bytes_per_partition"] = s.sbuf().bytes_per_partition();
  d["psum_partitions"] = s.psum().partitions();
  d["psum_bytes_per_partition"] = s.psum().bytes_per_partition();
  d["psum_banks"] = s.psum().banks();
  d["pe_rows"] = s.tensor().pe_rows();
  d["pe_columns"] = s.tensor().pe_columns();
  d["max_moving_free"] = s.tensor().max_moving_free();
  d["dma_engines"] = s.dma().engines();
  return d;
}

// EagerRecord.op must live forever: kernel names are interned.
const char* Intern(const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

// Charges a kernel run of `modelled_us` to the compute clock and logs it as
// one eager operation of kind "nki"; returns the clock when it started.
double Charge(const std::string& name, double modelled_us, double wall_us,
              std::uint64_t bytes, int device) {
  NEURON_CHECK(modelled_us >= 0, "nki: kernel ", name, " has a negative time ", modelled_us);
  nr::SettlePendingCompute("other");  // an open adaptive-eager region ran before it
  const auto clock = nr::ProcessClock();
  const double start = clock->compute().count();
  clock->AdvanceCompute(nr::SimDuration(modelled_us));
  neuron::aten::OpLog::Get().Add(
      {Intern("nki::" + name), start, modelled_us, wall_us, bytes, "nki",
       neuron::aten::CachingAllocator::Get().Allocated(static_cast<c10::DeviceIndex>(device))});
  return start;
}

// A CPU tensor over a "neuron" tensor's bytes (same dtype, sizes, strides):
// reading or writing it is not an eager operation and costs nothing.
at::Tensor HostView(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  NEURON_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
               "nki: a kernel's tensors live on the CPU or \"neuron\", not ", t.device().str());
  return neuron::aten::TensorOn(neuron::aten::HostStorage(t.storage(), /*resizable=*/false),
                                c10::DispatchKey::CPU, t);
}

// CPU tensors over a plan's operands (no copy).
std::vector<at::Tensor> Tensors(const std::vector<nr::KernelOperand>& operands) {
  std::vector<at::Tensor> out;
  for (const auto& o : operands) {
    out.push_back(at::from_blob(
        o.data, o.shape,
        at::TensorOptions().dtype(neuron::compiler::ScalarTypeOf(o.dtype))));
  }
  return out;
}

// `results` (what the kernel returned) into the plan's outputs, checked
// against their shapes and dtypes.
void CopyResults(const std::string& key, const py::object& results,
                 const std::vector<nr::KernelOperand>& outputs) {
  const auto list = results.cast<std::vector<at::Tensor>>();
  NEURON_CHECK(list.size() == outputs.size(), "nki kernel ", key, " in a compiled graph returned ",
               list.size(), " tensors, the graph expects ", outputs.size());
  const auto targets = Tensors(outputs);
  for (std::size_t k = 0; k < list.size(); ++k) {
    NEURON_CHECK(list[k].sizes() == targets[k].sizes() &&
                     list[k].scalar_type() == targets[k].scalar_type(),
                 "nki kernel ", key, " in a compiled graph: output ", k, " is ",
                 list[k].scalar_type(), list[k].sizes(), ", the graph traced ",
                 targets[k].scalar_type(), targets[k].sizes());
    targets[k].copy_(list[k]);
  }
}

// Registers `fn(list of input tensors) -> list of output tensors` as the
// custom kernel `key`; the executor calls it without the GIL held.
void RegisterGraphKernel(const std::string& key, py::function fn) {
  // Kept for the process: plans may run it until exit.
  auto held = std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function*) {});
  nr::RegisterCustomKernel(key, [key, held](const std::vector<nr::KernelOperand>& in,
                                            const std::vector<nr::KernelOperand>& out) {
    py::gil_scoped_acquire gil;
    try {
      CopyResults(key, (*held)(Tensors(in)), out);
    } catch (py::error_already_set& e) {
      throw neuron::InvalidUsage("nki kernel " + key + " in a compiled graph: " + e.what());
    } catch (const py::cast_error& e) {
      throw neuron::InvalidUsage("nki kernel " + key +
                                 " in a compiled graph did not return tensors: " + e.what());
    } catch (const neuron::Error&) {
      throw;  // CopyResults' own, naming the output
    } catch (const std::exception& e) {  // e.g. c10::Error from copy_
      throw neuron::InvalidUsage("nki kernel " + key + " in a compiled graph: " + e.what());
    }
  });
}

}  // namespace

void BindNki(py::module_& m) {
  m.def("_nki_spec", &Spec, "The device spec's SBUF, PSUM, tensor engine and DMA figures.");
  m.def(
      "_nki_matmul_us",
      [](std::int64_t m, std::int64_t k, std::int64_t n, bool fp32) {
        return Model().Matmul(m, k, n, fp32).time.count();
      },
      py::arg("m"), py::arg("k"), py::arg("n"), py::arg("fp32"),
      "One tensor engine matmul's time (us): [m,k] x [k,n].");
  m.def(
      "_nki_elementwise_us",
      [](const std::string& engine, std::int64_t elements, int inputs, bool dependent) {
        return Model().Elementwise(EngineNamed(engine), elements, inputs, dependent).count();
      },
      py::arg("engine"), py::arg("elements"), py::arg("inputs"), py::arg("dependent"),
      "One vector/scalar/gpsimd instruction's time (us).");
  m.def(
      "_nki_dma_us",
      [](std::uint64_t bytes, std::uint32_t partitions) {
        return std::make_pair(Model().Dma(bytes, partitions).count(),
                              Model().DmaLatency().count());
      },
      py::arg("bytes"), py::arg("partitions"),
      "One DMA's (time, latency part) in us.");
  m.def("_nki_host_view", &HostView, py::arg("tensor"),
        "A CPU tensor over a \"neuron\" tensor's memory (free: not an eager op).");
  m.def("_nki_charge", &Charge, py::arg("name"), py::arg("modelled_us"), py::arg("wall_us"),
        py::arg("bytes"), py::arg("device"),
        "Charges a kernel run to the compute clock as one eager operation (kind nki).");
  m.def("_nki_register_graph_kernel", &RegisterGraphKernel, py::arg("key"), py::arg("fn"),
        "Registers fn(list of input tensors) -> list of outputs as the custom kernel `key` "
        "that compiled graphs' plans call (OP_CUSTOM_KERNEL).");
}
