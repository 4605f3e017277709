#include "neuron/aten/devices.h"

#include <cstdlib>
#include <sstream>

#include "neuron/runtime/config.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/topology.h"

namespace neuron::aten {
namespace {

using runtime::ConfigKey;
using runtime::ConfigRegistry;

constexpr int kDefaultLnc = 2;

int ParseIndex(const std::string& part, int node_cores) {
  char* end = nullptr;
  const long value = std::strtol(part.c_str(), &end, 10);
  NEURON_CHECK(!part.empty() && end != nullptr && *end == '\0',
               "NEURON_RT_VISIBLE_CORES: '", part, "' is not a core index");
  NEURON_CHECK(value >= 0 && value < node_cores, "NEURON_RT_VISIBLE_CORES: core ", value,
               " is beyond the node's ", node_cores, " logical cores (0-", node_cores - 1, ")");
  return static_cast<int>(value);
}

int LogicalCoreConfig(const runtime::Topology& topology) {
  int lnc = static_cast<int>(topology.spec().logical_nc_config());
  if (ConfigRegistry::Get().Find(ConfigKey::kLogicalCoreConfig)) {
    lnc = static_cast<int>(ConfigRegistry::Get().GetInt(ConfigKey::kLogicalCoreConfig));
    NEURON_CHECK(lnc == 1 || lnc == 2, "NEURON_LOGICAL_NC_CONFIG must be 1 or 2, got ", lnc);
  }
  return lnc == 0 ? kDefaultLnc : lnc;
}

DeviceInventory Discover() {
  const runtime::Topology topology = runtime::Topology::FromEnvironment();
  const runtime::DeviceSpec device = runtime::DeviceSpec::FromEnvironment();
  DeviceInventory inv;
  inv.lnc = LogicalCoreConfig(topology);
  const int physical = static_cast<int>(topology.CoresPerChip());
  NEURON_CHECK(physical % inv.lnc == 0, "topology ", topology.origin(), ": cores_per_chip ",
               physical, " is not a multiple of the logical core size ", inv.lnc);
  inv.node_cores = static_cast<int>(topology.spec().chips_per_node()) * physical / inv.lnc;
  const auto visible = ConfigRegistry::Get().Find(ConfigKey::kVisibleCores);
  if (visible) {
    inv.node_core = ParseVisibleCores(*visible, inv.node_cores);
  } else {
    for (int i = 0; i < inv.node_cores; ++i) inv.node_core.push_back(i);
  }
  inv.count = static_cast<int>(inv.node_core.size());
  inv.capacity_bytes = device.HbmBytes() * static_cast<std::uint64_t>(inv.lnc);
  inv.name = StrCat(device.spec().name(), " (LNC=", inv.lnc, ")");
  return inv;
}

c10::DeviceIndex DefaultDevice() {
  const auto local = ConfigRegistry::Get().Find(ConfigKey::kLocalRank);
  if (!local) return 0;
  char* end = nullptr;
  const long rank = std::strtol(local->c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || rank < 0 || rank >= Inventory().count) return 0;
  return static_cast<c10::DeviceIndex>(rank);
}

thread_local c10::DeviceIndex current_device = -1;

}  // namespace

std::vector<int> ParseVisibleCores(const std::string& text, int node_cores) {
  std::vector<int> cores;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto dash = part.find('-');
    const int first = ParseIndex(part.substr(0, dash), node_cores);
    const int last = dash == std::string::npos ? first
                                               : ParseIndex(part.substr(dash + 1), node_cores);
    NEURON_CHECK(first <= last, "NEURON_RT_VISIBLE_CORES: range '", part, "' runs backwards");
    for (int c = first; c <= last; ++c) {
      for (int seen : cores) {
        NEURON_CHECK(seen != c, "NEURON_RT_VISIBLE_CORES: core ", c, " is listed twice");
      }
      cores.push_back(c);
    }
  }
  NEURON_CHECK(!cores.empty(), "NEURON_RT_VISIBLE_CORES: '", text, "' names no core");
  return cores;
}

const DeviceInventory& Inventory() {
  static const DeviceInventory inventory = Discover();
  return inventory;
}

c10::DeviceIndex CheckIndex(c10::DeviceIndex index, const char* what) {
  if (index == -1) return CurrentDevice();
  const int count = Inventory().count;
  NEURON_CHECK(index >= 0 && index < count, what, ": device index ", static_cast<int>(index),
               " is invalid: this process sees ", count, " neuron device",
               count == 1 ? "" : "s", " (neuron:0 to neuron:", count - 1, ")");
  return index;
}

c10::DeviceIndex CurrentDevice() {
  if (current_device < 0) current_device = DefaultDevice();
  return current_device;
}

void SetCurrentDevice(c10::DeviceIndex index) {
  current_device = CheckIndex(index, "set_device");
}

}  // namespace neuron::aten
