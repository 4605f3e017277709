// The direct shared-memory algorithms (ranks on one host): allreduce and
// reduce-scatter staged through the shared windows, and the small-message
// allreduce from the windows or the header slots. The registered-buffer
// allreduce is in registered_allreduce.cc.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "wire.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/shared_windows.h"

namespace neuron::collectives {

using detail::Begin;
using detail::kCollectedPhase;
using detail::kReducedPhase;
using detail::kStagedPhase;

// Direct shared-memory reduction (the scheme of shared-memory allreduce in
// CPU collective libraries such as oneCCL and DeepSpeed's shm backend): per
// window-sized chunk, every rank stages its input in its shared window (all
// but its own slice), then reduces its 1/n slice straight from every other
// rank's window and its own buffer, in rank order, into its own window, then
// copies every rank's reduced slice out. Three phase flags order it; each
// element is reduced exactly once, over all ranks in rank order, so the
// result is the naive reference's, bitwise.
void DirectAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                     ReduceOp op, const Label& what, bool staged) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  const std::size_t chunk = g.WindowDataBytes() / esize;
  std::vector<const void*> inputs(size);
  for (std::size_t start = 0; start < count; start += chunk) {
    const std::size_t n = std::min(chunk, count - start);
    char* mine = data + start * esize;
    const std::uint64_t seq = g.window_sequence() + 1;
    const std::size_t b = Begin(n, size, rank), e = Begin(n, size, rank + 1);
    if (!staged) {  // else the handshake staged everything and all ranks saw it
      // The data areas are free once every rank collected their last use.
      g.windows()->WaitPhase(kCollectedPhase, g.window_sequence(), g.NewDeadline(), what);
      // Every slice but this rank's own, which only this rank reduces (from
      // `mine`, below).
      std::memcpy(g.WindowData(rank), mine, b * esize);
      std::memcpy(g.WindowData(rank) + e * esize, mine + e * esize, (n - e) * esize);
      g.windows()->SyncPhase(kStagedPhase, seq, g.NewDeadline(), what);
    }
    g.window_sequence() = seq;
    for (int r = 0; r < size; ++r) inputs[r] = g.WindowData(r) + b * esize;
    inputs[rank] = mine + b * esize;  // this rank's own input, as it was staged
    if (e > b) {
      // Only this rank reads or writes slice `rank` of its own window now.
      ReduceInputs(dtype, op, inputs.data(), inputs.size(),
                   g.WindowData(rank) + b * esize, e - b, static_cast<std::size_t>(size));
    }
    g.windows()->SyncPhase(kReducedPhase, seq, g.NewDeadline(), what);
    for (int r = 0; r < size; ++r) {
      const std::size_t rb = Begin(n, size, r), re = Begin(n, size, r + 1);
      std::memcpy(mine + rb * esize, g.WindowData(r) + rb * esize, (re - rb) * esize);
    }
    g.windows()->PublishPhase(kCollectedPhase, seq);
  }
}

// Reduce-scatter by direct shared-memory reduction: each round every rank
// stages the next piece of every block in its window, then reduces the
// piece of its own block from all windows, in rank order (so the result
// equals the naive reference bitwise, as the direct allreduce's does).
void DirectReduceScatter(GroupContext& g, const char* input, char* output,
                         const std::vector<std::size_t>& chunks, DataType dtype,
                         ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  const std::size_t piece = std::max<std::size_t>(1, g.WindowDataBytes() / esize / size);
  std::size_t longest = 0;
  for (int r = 0; r < size; ++r) longest = std::max(longest, chunks[r + 1] - chunks[r]);
  std::vector<const void*> inputs(size);
  auto length = [&](int block, std::size_t start) {
    const std::size_t count = chunks[block + 1] - chunks[block];
    return start < count ? std::min(piece, count - start) : 0;
  };
  for (std::size_t start = 0; start < longest; start += piece) {
    // The windows are free once every rank collected from them.
    g.windows()->WaitPhase(kCollectedPhase, g.window_sequence(), g.NewDeadline(), what);
    const std::uint64_t seq = ++g.window_sequence();
    for (int b = 0; b < size; ++b) {
      const std::size_t n = length(b, start);
      if (n > 0) {
        std::memcpy(g.WindowData(rank) + b * piece * esize,
                    input + (chunks[b] + start) * esize, n * esize);
      }
    }
    g.windows()->SyncPhase(kStagedPhase, seq, g.NewDeadline(), what);
    const std::size_t n = length(rank, start);
    if (n > 0) {
      for (int r = 0; r < size; ++r) inputs[r] = g.WindowData(r) + rank * piece * esize;
      ReduceInputs(dtype, op, inputs.data(), inputs.size(), output + start * esize, n,
                   static_cast<std::size_t>(size));
    }
    g.windows()->PublishPhase(kCollectedPhase, seq);
  }
}

// The small-message form of the direct reduction: the handshake already
// staged every rank's data (in the headers, the header slots or the
// windows, as `path` says), so each rank reduces the whole buffer from all
// of them (in rank order, like the naive reference) and is done.
void DirectAllReduceFrom(GroupContext& g, const void* const* inputs, char* data,
                         std::size_t count, DataType dtype, ReduceOp op,
                         bool from_windows) {
  ReduceInputs(dtype, op, inputs, static_cast<std::size_t>(g.size()), data, count,
               static_cast<std::size_t>(g.size()));
  // The windows' data areas are reused once every rank collected from them.
  if (from_windows) g.windows()->PublishPhase(kCollectedPhase, ++g.window_sequence());
}

}  // namespace neuron::collectives
