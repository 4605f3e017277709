// Registers the "neuron" device's bindings (neuron::aten) in torchneuron._C.
#pragma once

#include <pybind11/pybind11.h>

void BindDevice(pybind11::module_& m);
