// The "neuron" devices a process sees: the logical NeuronCores of its node
// as the topology defines them (chips_per_node x cores_per_chip / LNC),
// narrowed by NEURON_RT_VISIBLE_CORES, each with the HBM of its physical
// cores; and the calling thread's current device.
//
// Usage:
//   const DeviceInventory& inv = Inventory();     // inv.count, inv.capacity_bytes
//   c10::DeviceIndex i = CheckIndex(3, "set_device");   // throws past count
//   SetCurrentDevice(i);
//   c10::DeviceIndex now = CurrentDevice();
//   at::Generator g = DefaultGenerator(now);
//
// The inventory is read once, at first use, from the environment
// (NEURON_TOPOLOGY_FILE, NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES,
// NEURON_DEVICE_FILE); a bad value throws InvalidUsage naming the variable.
// A thread starts on the process's default device: LOCAL_RANK when it is
// below the count, else 0.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::aten {

struct DeviceInventory {
  int count = 0;                     // devices this process sees
  int node_cores = 0;                // logical cores of the node
  int lnc = 2;                       // physical cores per logical core
  std::vector<int> node_core;        // device index -> logical core of the node
  std::uint64_t capacity_bytes = 0;  // HBM per device
  std::string name;                  // e.g. "NeuronCore-v3 (LNC=2)"
};

const DeviceInventory& Inventory();

// `index`, or the current device when it is -1; throws InvalidUsage naming
// `what`, the index and the count when it is out of range.
c10::DeviceIndex CheckIndex(c10::DeviceIndex index, const char* what);

c10::DeviceIndex CurrentDevice();
void SetCurrentDevice(c10::DeviceIndex index);  // checked

// The device's default random generator: random operations on neuron
// tensors draw from it, with the CPU's algorithm (so a seeded run draws the
// same numbers as on the CPU). torch.manual_seed seeds it.
const at::Generator& DefaultGenerator(c10::DeviceIndex index);

// Parses a NEURON_RT_VISIBLE_CORES value ("0-3", "0,2,5") against a node of
// `node_cores` logical cores; throws InvalidUsage naming the bad part.
std::vector<int> ParseVisibleCores(const std::string& text, int node_cores);

}  // namespace neuron::aten
