// Turning a rank's end into a JobFailure record, and a JobFailure into the
// summary neuronrun prints.
#pragma once

#include <string>

#include "neuron/launcher/rendezvous.pb.h"
#include "rank_group.h"

namespace neuron::launcher {

proto::JobFailure FailureOfRank(const RankExit& exit, std::uint32_t node_rank,
                                const std::string& hostname);

// Lines prefixed "neuronrun: ": who failed, how, and the stderr tail.
std::string FormatFailure(const proto::JobFailure& failure);

}  // namespace neuron::launcher
