// The IR dtypes the device runs ("f32", "bf16", ...) and the runtime's
// element type of each: the one table lowering and the torch frontends share.
#pragma once

#include <string>

#include "neuron/runtime/device/executable.h"

namespace neuron::compiler {

// The device's element type of IR dtype `dtype`; InvalidUsage, naming
// `where`, for one the device does not run (f64, ...).
runtime::proto::ElementType DeviceElementType(const std::string& dtype,
                                              const std::string& where);
// The IR's name of a device element type ("f32", ...).
const char* IrDtypeName(runtime::proto::ElementType type);

}  // namespace neuron::compiler
