// The host algorithms, as free functions over a group (group_context.h):
// every rank of the group calls the same one with matching arguments.
// `what` names the operation in errors. Communicator::AllReduce and its
// siblings choose among them (the tuner) after their handshake.
#pragma once

#include <cstddef>
#include <vector>

#include "neuron/collectives/dtype.h"
#include "neuron/collectives/group_context.h"

namespace neuron::collectives {

using transport::Label;

// point_algorithms.cc (any transport):
// Ring reduce-scatter in place: rank r ends with chunk r (elements
// [chunks[r], chunks[r+1]) of `data`) reduced over all ranks.
void RingReduceScatter(GroupContext& g, char* data,
                       const std::vector<std::size_t>& chunks, DataType dtype,
                       ReduceOp op, const Label& what);
// Ring allgather in place of `count` elements in equal chunks (Begin()).
void RingAllGather(GroupContext& g, char* data, std::size_t count, DataType dtype,
                   const Label& what);
void RecursiveDoublingAllReduce(GroupContext& g, char* data, std::size_t count,
                                DataType dtype, ReduceOp op, const Label& what);
void RabenseifnerAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                           ReduceOp op, const Label& what);
// `block` bytes from every rank into `out`, in rank order.
void BruckAllGather(GroupContext& g, char* out, const void* in, std::size_t block,
                    const Label& what);

// direct_algorithms.cc (shared windows):
// `staged`: the handshake already staged all of `data` (it fits the windows).
void DirectAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                     ReduceOp op, const Label& what, bool staged);
void DirectReduceScatter(GroupContext& g, const char* input, char* output,
                         const std::vector<std::size_t>& chunks, DataType dtype,
                         ReduceOp op, const Label& what);

}  // namespace neuron::collectives
