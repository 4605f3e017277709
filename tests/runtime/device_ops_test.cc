// The device's op registry (device_ops.h) and the executable format's Op
// enum (executable.proto) name the same ops.
#include "neuron/runtime/device/device_ops.h"

#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>

namespace neuron::runtime {
namespace {

TEST(DeviceOps, TheRegistryAndTheFormatsEnumNameTheSameOps) {
  const auto* descriptor = proto::Op_descriptor();
  std::size_t count = 0;
  const DeviceOp* rows = DeviceOps(&count);
  ASSERT_EQ(count + 1, static_cast<std::size_t>(descriptor->value_count()))
      << "every Op but OP_UNSPECIFIED has a row";
  std::set<std::string> names;
  for (std::size_t k = 0; k < count; ++k) {
    const DeviceOp& row = rows[k];
    const auto* value = descriptor->FindValueByNumber(row.op);
    ASSERT_NE(value, nullptr) << row.name;
    std::string expected = value->name().substr(3);  // without OP_
    for (char& c : expected)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(row.name, expected);
    EXPECT_EQ(FindDeviceOp(row.op), &row);
    EXPECT_TRUE(names.insert(row.name).second) << row.name << " twice";
    EXPECT_EQ(row.fusible, std::string(row.kernel) == "Elementwise") << row.name;
    EXPECT_EQ(row.dma, std::string(row.kernel) == "Dma") << row.name;
    if (row.fusible) {
      EXPECT_TRUE(row.inputs == 1 || row.inputs == 2) << row.name;
    }
  }
  EXPECT_EQ(FindDeviceOp(proto::OP_UNSPECIFIED), nullptr);
  EXPECT_EQ(FindDeviceOp(static_cast<proto::Op>(count + 1)), nullptr);
  EXPECT_EQ(DeviceOpName(proto::OP_LAYER_NORM_BACKWARD_ROWS), "layer_norm_backward_rows");
  EXPECT_EQ(DeviceOpName(static_cast<proto::Op>(999)), "op 999");
}

}  // namespace
}  // namespace neuron::runtime
