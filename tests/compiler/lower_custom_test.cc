// The custom kernel node (nki.kernel, lower_custom.h): one OP_CUSTOM_KERNEL
// instruction over HBM buffers, an on-chip input stored for it and its
// result loaded by its reader, timed by the node's attributes; unsound
// attributes refused naming the node.
#include <gtest/gtest.h>

#include <string>

#include "neuron/compiler/graph_text.h"
#include "neuron/compiler/lower.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

namespace rp = runtime::proto;

// relu(x) and x into the kernel, neg of its result returned.
std::string Graph(const std::string& attrs) {
  return "graph k(%x: f32[4,8]) {\n"
         "  %a: f32[4,8] = aten.relu(%x)\n"
         "  %o: f32[4,8] = nki.kernel(%a, %x) {" + attrs + "}\n"
         "  %b: f32[4,8] = aten.neg(%o)\n"
         "  return %b\n"
         "}\n";
}

const rp::Buffer& BufferOf(const rp::Executable& e, std::uint32_t id) {
  for (const auto& b : e.buffers())
    if (b.id() == id) return b;
  throw std::out_of_range("no buffer");
}

std::string ErrorOf(const std::string& attrs) {
  try {
    Lower(ParseGraph(Graph(attrs)), runtime::DeviceSpec::Default());
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "no error";
}

TEST(LowerCustomKernel, OneInstructionOverHbmTimedByItsAttributes) {
  const rp::Executable e =
      Lower(ParseGraph(Graph("kernel = \"t::k@1\", time_us = 5.0, hbm_bytes = 256, "
                             "busy_vector = 3.0, busy_dma = 4.5")),
            runtime::DeviceSpec::Default())
          .executable;
  int kernels = 0, stored = -1, kernel_at = -1, loaded = -1;
  for (int k = 0; k < e.instructions_size(); ++k) {
    const auto& i = e.instructions(k);
    if (i.op() == rp::OP_CUSTOM_KERNEL) {
      ++kernels, kernel_at = k;
      EXPECT_EQ(i.kernel(), "t::k@1");
      EXPECT_DOUBLE_EQ(i.kernel_us(), 5.0);
      EXPECT_EQ(i.bytes(), 256u);
      EXPECT_EQ(i.engine(), rp::DMA);  // the busiest of its engines
      ASSERT_EQ(i.kernel_engines_size(), 2);
      EXPECT_EQ(i.kernel_engines(0), rp::VECTOR);
      EXPECT_DOUBLE_EQ(i.kernel_busy_us(1), 4.5);
      ASSERT_EQ(i.inputs_size(), 2);
      EXPECT_EQ(BufferOf(e, i.inputs(0)).name(), "hbm:a");  // stored for it
      EXPECT_EQ(BufferOf(e, i.inputs(1)).name(), "hbm:x");  // the graph's input as it is
      EXPECT_EQ(BufferOf(e, i.outputs(0)).name(), "hbm:o");
      EXPECT_EQ(BufferOf(e, i.outputs(0)).space(), rp::HBM);
    } else if (i.op() == rp::OP_STORE && BufferOf(e, i.outputs(0)).name() == "hbm:a") {
      stored = k;
    } else if (i.op() == rp::OP_LOAD && BufferOf(e, i.inputs(0)).name() == "hbm:o") {
      loaded = k;
    }
  }
  EXPECT_EQ(kernels, 1);
  EXPECT_TRUE(stored >= 0 && stored < kernel_at && kernel_at < loaded)
      << stored << " " << kernel_at << " " << loaded;
}

TEST(LowerCustomKernel, UnsoundAttributesAreRefusedNamingTheNode) {
  EXPECT_NE(ErrorOf("time_us = 5.0, busy_dma = 1.0").find(
                "node 1 (nki.kernel): a custom kernel needs its kernel key"),
            std::string::npos);
  EXPECT_NE(ErrorOf("kernel = \"t::k@1\", busy_dma = 1.0").find("has no time_us"),
            std::string::npos);
  EXPECT_NE(ErrorOf("kernel = \"t::k@1\", time_us = 5.0, busy_vector = 9.0")
                .find("busy_vector = 9 is not within its 5 us"),
            std::string::npos);
  EXPECT_NE(ErrorOf("kernel = \"t::k@1\", time_us = 5.0").find("names no engine"),
            std::string::npos);
}

}  // namespace
}  // namespace neuron::compiler
