// DDP's timer for "neuron" (c10d's TimerRegistry): DDP's logging data
// (torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data) times
// forward, backward compute and backward communication on the rank's
// simulated compute clock, so its averages are modelled device times.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "neuron/runtime/sim_clock.h"

namespace neuron::aten {
namespace {

class NeuronTimer final : public ::c10d::Timer {
 public:
  explicit NeuronTimer(c10::Device) {}

  void record(Event event) override {
    getTimeRef(event) =
        static_cast<int64_t>(runtime::ProcessClock()->compute().count() * 1000.0);  // ns
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t a = getTimeRef(start);
    const int64_t b = getTimeRef(end);
    if (a == ::c10d::kUnsetTime || b == ::c10d::kUnsetTime || b < a) return std::nullopt;
    return b - a;
  }
};

}  // namespace
}  // namespace neuron::aten

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, neuron::aten::NeuronTimer)
}  // namespace c10d
