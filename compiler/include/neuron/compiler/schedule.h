// Scheduling: the order each engine issues its instructions in. Engines run
// their instructions in list order, each waiting for its dependencies, so
// an instruction off the critical path listed early delays what follows it
// on that engine. ScheduleInstructions reorders a lowered plan by list
// scheduling (always the ready instruction with the longest modelled path
// to the end), keeps the dependencies the lowering computed (data and the
// reuse of memory), and keeps the new order only when the modelled plan is
// shorter.
//
//   ScheduleResult r = ScheduleInstructions(lowered.executable, CostModel(device));
//   r.before_us, r.after_us  // the plan's modelled time in the two orders
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
