// The direct allreduce over registered buffers (transport/shared_buffers.h):
// every rank's buffer is mapped by every other rank, so nothing is staged.
//
// Rank r reduces slice r (Begin(count, n, r) onwards) straight from every
// rank's buffer, in rank order (so the result is the naive reference's,
// bitwise, as the staged form's is), and writes it straight into slice r of
// every buffer. During the operation only rank r reads or writes slice r of
// any buffer, so one phase after the handshake is enough: once every rank
// has published "reduced", every buffer holds the whole result and no rank
// touches another's buffer again. Memory traffic per rank: the buffer read
// once and written once (the staged form copies in, reduces and copies out:
// five times the buffer). The same scheme as NCCL's registered-buffer
// (user buffer) intra-node collectives.
#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "algorithms.h"
#include "wire.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/collectives/transport/shared_windows.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace {

// Blocks small enough to stay in cache between their reduction and the
// copies into the other buffers.
constexpr std::size_t kBlockBytes = 64u << 10;
}  // namespace

void RegisteredAllReduce(GroupContext& g, transport::PeerBufferMap& peers,
                         const transport::SharedRegion* regions, char* data,
                         std::size_t count, DataType dtype, ReduceOp op,
                         const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  peers.SweepIfDue();  // before this operation's buffers are mapped and used
  std::vector<char*> buffers(static_cast<std::size_t>(size));
  try {
    for (int r = 0; r < size; ++r) buffers[r] = r == rank ? data : peers.Map(regions[r]);
  } catch (const std::exception& e) {  // IoError, or bad_alloc
    // The others must not wait for this rank.
    const std::string message = StrCat(what, " on rank ", rank, ": ", e.what());
    g.transport().Abort(message);
    throw IoError(message);
  }
  const std::size_t begin = detail::Begin(count, size, rank);
  const std::size_t end = detail::Begin(count, size, rank + 1);
  const std::size_t block = std::max<std::size_t>(1, kBlockBytes / esize);
  std::vector<const void*> inputs(static_cast<std::size_t>(size));
  for (std::size_t start = begin; start < end; start += block) {
    const std::size_t n = std::min(block, end - start);
    const std::size_t at = start * esize;
    for (int r = 0; r < size; ++r) inputs[r] = buffers[r] + at;
    ReduceInputs(dtype, op, inputs.data(), inputs.size(), data + at, n,
                 static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      if (r != rank) std::memcpy(buffers[r] + at, data + at, n * esize);
    }
  }
  const std::uint64_t seq = ++g.window_sequence();
  g.windows()->SyncPhase(detail::kReducedPhase, seq, g.NewDeadline(), what);
  // The windows were not used: they are as free as before.
  g.windows()->PublishPhase(detail::kCollectedPhase, seq);
}

}  // namespace neuron::collectives
