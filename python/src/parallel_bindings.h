// Registers neuron::parallel's bindings in torchneuron._C.
#pragma once

#include <pybind11/pybind11.h>

void BindParallel(pybind11::module_& m);
