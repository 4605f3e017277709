// Scheduling: the order each engine issues its instructions in. Engines run
// their instructions in list order, each waiting for its dependencies, so
// an instruction off the critical path listed early delays what follows it
// on that engine. ScheduleInstructions tries two list schedules of a
// lowered plan: by priority (always the ready instruction with the longest
// modelled path to the end) and by simulated start (always the ready
// instruction that can start first, the highest priority on a tie: DMA of
// returned values then overlaps the compute still running). It keeps the
// dependencies the lowering computed (data and the reuse of memory), and
// the faster order only when the modelled plan is shorter than the
// lowering's.
//
//   ScheduleResult r = ScheduleInstructions(lowered.executable, CostModel(device));
//   r.before_us, r.after_us  // the plan's modelled time before and after
#pragma once

#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/executable.pb.h"

namespace neuron::compiler {

struct ScheduleResult {
  double before_us = 0;
  double after_us = 0;  // equals before_us when the order was kept
  bool reordered = false;
};

ScheduleResult ScheduleInstructions(runtime::proto::Executable& executable,
                                    const runtime::CostModel& model);

}  // namespace neuron::compiler
