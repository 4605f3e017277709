// torchneuron._C's fallback report functions (torchneuron.fallback_report):
// recording on and off, the rows, and the site function that finds the
// user's source line of a fallback (neuron::aten::FallbackReport).
#include "bindings.h"

#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <string>
#include <vector>

#include "neuron/aten/fallback_report.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;
namespace na = neuron::aten;

namespace {

// Path prefixes of the frames that are not the user's (torch's and
// torchneuron's packages); read and written under the GIL.
std::vector<std::string>& InternalPrefixes() {
  static auto* prefixes = new std::vector<std::string>();
  return *prefixes;
}

bool Internal(const char* file) {
  for (const auto& prefix : InternalPrefixes()) {
    if (std::strncmp(file, prefix.c_str(), prefix.size()) == 0) return true;
  }
  return false;
}

// The innermost frame of the calling thread's Python stack whose file is
// outside the internal prefixes: the user's line that dispatched the op.
// A thread Python does not know (a C++ worker) is not made to take the GIL.
na::FallbackSite PythonUserSite() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) {
    return {"<no Python frame>", 0};
  }
  py::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  na::FallbackSite site{"<no Python frame>", 0};
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (file == nullptr) PyErr_Clear();
    const bool found = file != nullptr && !Internal(file);
    if (found) site = {file, PyFrame_GetLineNumber(frame)};
    Py_DECREF(code);
    PyFrameObject* back = found ? nullptr : PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  return site;
}

}  // namespace

void BindFallbackReport(py::module_& m) {
  m.def(
      "_fallback_report_start",
      [](const std::vector<std::string>& internal_prefixes) {
        InternalPrefixes() = internal_prefixes;
        na::FallbackReport::SetSiteFunction(&PythonUserSite);
        na::FallbackReport::Start();
      },
      py::arg("internal_prefixes"),
      "Starts (nests) recording CPU fallbacks with the first frame outside the "
      "files under `internal_prefixes`.");
  m.def("_fallback_report_stop", &na::FallbackReport::Stop,
        "Ends one recording started by _fallback_report_start.");
  m.def(
      "_fallback_report_rows",
      [] {
        py::list out;
        for (const auto& r : na::FallbackReport::Rows()) {
          out.append(py::make_tuple(r.op, r.file, r.line, r.count, r.modelled_us));
        }
        return out;
      },
      "Every (op, file, line, count, modelled_us) recorded in this process so far.");
  m.def(
      "_fallback_report_requested",
      [] {
        const std::string value = neuron::runtime::ConfigRegistry::Get().GetString(
            neuron::runtime::ConfigKey::kFallbackReport);
        NEURON_CHECK(value == "0" || value == "1", "NEURON_FALLBACK_REPORT='", value,
                     "' is neither 0 nor 1");
        return value == "1";
      },
      "NEURON_FALLBACK_REPORT, read through the configuration registry.");
}
