// torchneuron._C: the project's C++ core for Python, one Bind* per
// component (bindings.h), and the project's errors as Python exceptions.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;

namespace {

// neuron errors become Python exceptions deriving from RuntimeError:
//   NeuronError > InvalidUsageError, CollectiveTimeoutError, PeerError.
void RegisterErrors(py::module_& m) {
  static py::exception<neuron::Error> error(m, "NeuronError", PyExc_RuntimeError);
  static py::exception<neuron::InvalidUsage> invalid(m, "InvalidUsageError", error.ptr());
  static py::exception<neuron::TimeoutError> timeout(m, "CollectiveTimeoutError",
                                                     error.ptr());
  static py::exception<neuron::IoError> peer(m, "PeerError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const neuron::InvalidUsage& e) {
      PyErr_SetString(invalid.ptr(), e.what());
    } catch (const neuron::TimeoutError& e) {
      PyErr_SetString(timeout.ptr(), e.what());
    } catch (const neuron::IoError& e) {
      PyErr_SetString(peer.ptr(), e.what());
    } catch (const neuron::RemoteError& e) {
      PyErr_SetString(peer.ptr(), e.what());
    } catch (const neuron::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchneuron's C++ core: the neuron process group and its errors.";
  py::module_::import("torch.distributed");  // registers c10d's Python types
  RegisterErrors(m);
  BindBackend(m);
  BindCompiler(m);
  BindClock(m);
  BindDevice(m);
  BindParallelLayout(m);
  BindDataParallel(m);
  BindTensorParallel(m);
  BindCheckpoint(m);
  BindPipeline(m);
  BindPredict(m);
  BindNki(m);
  BindFallbackReport(m);
  BindAdaptiveEager(m);
}
