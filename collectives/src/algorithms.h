// The host algorithms, as free functions over a group (group_context.h):
// every rank of the group calls the same one with matching arguments.
// `what` names the operation in errors. Communicator::AllReduce and its
// siblings check the call (handshake.h), choose among them (tuner.h) and
// run one inside their accounting hook (op_accounting.h).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "neuron/collectives/dtype.h"
#include "neuron/collectives/group_context.h"

namespace neuron::collectives {

namespace transport {
class PeerBufferMap;
struct SharedRegion;
}  // namespace transport

using transport::Label;

// Blocks of counts[r] elements packed in rank order: block r starts at
// byte offsets[r]; offsets[size] is the whole.
struct BlockLayout {
  BlockLayout(std::vector<std::size_t> block_counts, std::size_t element_size)
      : counts(std::move(block_counts)),
        offsets(counts.size() + 1, 0),
        element_bytes(element_size) {
    for (std::size_t i = 0; i < counts.size(); ++i)
      offsets[i + 1] = offsets[i] + counts[i] * element_bytes;
  }
  std::vector<std::size_t> counts;
  std::vector<std::size_t> offsets;
  std::size_t element_bytes;
};

// point_algorithms.cc (any transport):
// Ring reduce-scatter in place: rank r ends with chunk r (elements
// [chunks[r], chunks[r+1]) of `data`) reduced over all ranks.
void RingReduceScatter(GroupContext& g, char* data,
                       const std::vector<std::size_t>& chunks, DataType dtype,
                       ReduceOp op, const Label& what);
// Ring reduce-scatter then ring allgather, in place.
void RingAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                   ReduceOp op, const Label& what);
// Ring reduce-scatter of `input` (blocks at chunks[r], in elements) into
// `output`, rank r's block; the input stays unchanged.
void RingReduceScatterInto(GroupContext& g, const char* input, char* output,
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

// rooted_algorithms.cc (any transport): `root` is a rank of the group.
void BinomialBroadcast(GroupContext& g, void* data, std::size_t bytes, int root,
                       const Label& what);
// The root's `data` becomes the reduction over every rank's, in rank order.
void LinearReduce(GroupContext& g, void* data, std::size_t count, DataType dtype,
                  ReduceOp op, int root, const Label& what);
// `block` bytes of every rank's input into the root's output, in rank order.
void LinearGather(GroupContext& g, const void* input, void* output, std::size_t block,
                  int root, const Label& what);
// Block r of the root's input (`block` bytes each) into rank r's output.
void LinearScatter(GroupContext& g, const void* input, void* output, std::size_t block,
                   int root, const Label& what);

// exchange_algorithms.cc (any transport):
// Block p of `in` (send) to rank p, block p of `out` (recv) from rank p;
// `check_counts`: the ranks exchange and check the counts first.
void PairwiseAllToAll(GroupContext& g, const char* in, char* out, const BlockLayout& send,
                      const BlockLayout& recv, bool check_counts, const Label& what);
// This rank's block `in` (blocks.counts[rank] elements) and every other
// rank's into `out`, packed as `blocks` says.
void RingAllGatherV(GroupContext& g, const void* in, char* out, const BlockLayout& blocks,
                    const Label& what);
void DisseminationBarrier(GroupContext& g, const Label& what);

// direct_algorithms.cc (shared windows):
// `staged`: the handshake already staged all of `data` (it fits the windows).
void DirectAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                     ReduceOp op, const Label& what, bool staged);
void DirectReduceScatter(GroupContext& g, const char* input, char* output,
                         const std::vector<std::size_t>& chunks, DataType dtype,
                         ReduceOp op, const Label& what);
// The small direct allreduce, after a handshake that carried every rank's
// data: reduces inputs[r] (rank r's data, where the handshake put it; this
// rank's own is `data`) in rank order into `data`. `from_windows`: the
// inputs are in the windows' data areas, which are reused once every rank
// has collected from them (a phase).
void DirectAllReduceFrom(GroupContext& g, const void* const* inputs, char* data,
                         std::size_t count, DataType dtype, ReduceOp op,
                         bool from_windows);

// registered_allreduce.cc (shared windows): every rank's buffer is
// registered (regions[r], as rank r published it with its header): maps
// the peers' buffers (through `peers`) and reduces in place on all of them.
// A buffer that cannot be mapped aborts the group and throws IoError
// naming it.
void RegisteredAllReduce(GroupContext& g, transport::PeerBufferMap& peers,
                         const transport::SharedRegion* regions, char* data,
                         std::size_t count, DataType dtype, ReduceOp op,
                         const Label& what);

}  // namespace neuron::collectives
