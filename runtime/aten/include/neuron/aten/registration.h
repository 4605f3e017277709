// Makes PrivateUse1 the "neuron" device: its name, hooks, allocator,
// device guard, kernels, CPU fallback and autocast rules.
//
// Usage (once per process, from torchneuron's extension module):
//   neuron::aten::RegisterNeuronDevice();
//
// Idempotent. The guard, kernel and autocast registrations are static
// initializers of this library's objects (linked whole into the module);
// this call adds the parts PyTorch takes at run time.
#pragma once

namespace neuron::aten {

void RegisterNeuronDevice();
void RegisterHooks();  // device_hooks.cc

}  // namespace neuron::aten
