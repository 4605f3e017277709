#include "neuron/runtime/device/device_ops.h"

#include <cctype>
#include <vector>

namespace neuron::runtime {
namespace {

// The rows, indexed by enumerator (proto::Op runs 1.. without gaps).
struct Registry {
  std::vector<std::string> names;  // owns the rows' names
  std::vector<DeviceOp> rows;

  Registry() {
#define NEURON_DEVICE_OP_ROW(Id, Kernel, Inputs, Passes) \
  Add(proto::OP_##Id, #Id, #Kernel, Inputs, Passes);
    NEURON_FORALL_DEVICE_OPS(NEURON_DEVICE_OP_ROW)
#undef NEURON_DEVICE_OP_ROW
    for (std::size_t k = 0; k < rows.size(); ++k) rows[k].name = names[k].c_str();
  }

  void Add(proto::Op op, const char* id, const char* kernel, int inputs, int passes) {
    std::string name = id;
    for (char& c : name)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    names.push_back(std::move(name));
    const std::string family = kernel;
    rows.push_back(
        {op, nullptr, kernel, inputs, passes, family == "Elementwise", family == "Dma"});
  }
};

const Registry& Get() {
  static const Registry registry;
  return registry;
}

}  // namespace

const DeviceOp* FindDeviceOp(proto::Op op) {
  const auto& rows = Get().rows;
  const int index = static_cast<int>(op) - 1;
  if (index < 0 || index >= static_cast<int>(rows.size())) return nullptr;
  return rows[static_cast<std::size_t>(index)].op == op
             ? &rows[static_cast<std::size_t>(index)]
             : nullptr;
}

const DeviceOp* DeviceOps(std::size_t* count) {
  *count = Get().rows.size();
  return Get().rows.data();
}

std::string DeviceOpName(proto::Op op) {
  const DeviceOp* row = FindDeviceOp(op);
  return row != nullptr ? row->name : "op " + std::to_string(static_cast<int>(op));
}

}  // namespace neuron::runtime
