#include "neuron/runtime/device/lane_width.h"

#include <atomic>

#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

// The count the kernels' clones are built for (vector_math.h): the v4
// clone holds 16 floats in a register, the v3 clone 8, the default 4.
int CpuLaneWidth() {
#if NEURON_KERNEL_CLONES_BUILT
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return 16;
  if (__builtin_cpu_supports("x86-64-v3")) return 8;
#endif
  return 4;
}

std::atomic<int> chosen{0};  // 0: the CPU's

}  // namespace

int LaneWidth() {
  static const int cpu = CpuLaneWidth();
  const int set = chosen.load(std::memory_order_relaxed);
  return set != 0 ? set : cpu;
}

void SetLaneWidth(int lanes) {
  NEURON_CHECK(lanes == 0 || lanes == 4 || lanes == 8 || lanes == 16,
               "SetLaneWidth: the kernels run in 4, 8 or 16 lanes (0: the CPU's), not ",
               lanes);
  chosen.store(lanes, std::memory_order_relaxed);
}

}  // namespace neuron::runtime
