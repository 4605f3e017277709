// torchneuron._C's parts, one per component; module.cc calls each once.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

void BindBackend(pybind11::module_& m);         // the "neuron" process group, the job store
void BindCompiler(pybind11::module_& m);        // compiled graphs, the compile cache, dtypes
void BindClock(pybind11::module_& m);           // simulated clocks and traces, the device model
void BindDevice(pybind11::module_& m);          // the "neuron" device (neuron::aten)
void BindParallelLayout(pybind11::module_& m);  // mesh, sampler, token data
void BindDataParallel(pybind11::module_& m);    // DDP's reducer, ZeRO's units
void BindTensorParallel(pybind11::module_& m);  // tensor / sequence parallel collectives
void BindCheckpoint(pybind11::module_& m);      // sharded checkpoint files and manifests
void BindPipeline(pybind11::module_& m);        // pipeline schedules and engine
void BindPredict(pybind11::module_& m);         // cost descriptions for captured steps
void BindNki(pybind11::module_& m);             // the kernel language's device model (nki)
void BindFallbackReport(pybind11::module_& m);  // CPU fallbacks with source lines
void BindAdaptiveEager(pybind11::module_& m);   // adaptive eager's switch, pricer, counters

// A process group Python holds, as the intrusive_ptr neuron::parallel takes:
// the C++ object gains a reference, Python keeps its own.
inline c10::intrusive_ptr<::c10d::ProcessGroup> Owned(::c10d::ProcessGroup& group) {
  return c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&group);
}
