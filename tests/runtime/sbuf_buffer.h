// A test plan's buffer: `n` elements of `dtype`, flat, in SBUF at `offset`.
#pragma once

#include <cstdint>
#include <string>

#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::testing {

inline void AddBuffer(proto::Executable& e, std::uint32_t id, std::uint64_t offset,
                      proto::ElementType dtype, std::int64_t n) {
  auto* b = e.add_buffers();
  b->set_id(id), b->set_name("b" + std::to_string(id)), b->set_space(proto::SBUF);
  b->set_offset(offset), b->set_dtype(dtype), b->add_shape(n);
  b->set_bytes(n * ElementBytes(dtype));
}

}  // namespace neuron::runtime::testing
