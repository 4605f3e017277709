// Broadcast, reduce, gather and scatter: the algorithms with a root.
// Reduce, gather and scatter are linear (as MPICH's for small groups): the
// root exchanges a block with every other rank at once, and reduce
// combines the inputs in rank order at the root (so its result is the
// naive reference's, bitwise, float16/bfloat16 accumulated in float32).
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "wire.h"
#include "neuron/collectives/reduce.h"

namespace neuron::collectives {

using detail::Mod;

// Binomial tree (as in MPICH): relative rank v receives from v - 2^k for
// the lowest set bit k, then sends to v + 2^j for j < k.
void BinomialBroadcast(GroupContext& g, void* data, std::size_t bytes, int root,
                       const Label& what) {
  const int size = g.size();
  transport::Transport& t = g.transport();
  const int v = Mod(g.rank() - root, size);
  int mask = 1;
  while (mask < size) {
    if (v & mask) {
      t.Wait({t.Irecv(Mod(v - mask + root, size), data, bytes)}, g.NewDeadline(), what);
      break;
    }
    mask <<= 1;
  }
  std::vector<transport::RequestId> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < size)
      sends.push_back(t.Isend(Mod(v + mask + root, size), data, bytes));
  }
  t.Wait(sends, g.NewDeadline(), what);
}

void LinearReduce(GroupContext& g, void* data, std::size_t count, DataType dtype,
                  ReduceOp op, int root, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t bytes = count * ElementSize(dtype);
  transport::Transport& t = g.transport();
  if (rank != root) {
    t.Wait({t.Isend(root, data, bytes)}, g.NewDeadline(), what);
    return;
  }
  std::vector<std::vector<char>> theirs(size);
  std::vector<transport::RequestId> ids;
  std::vector<const void*> inputs(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      inputs[r] = data;
      continue;
    }
    theirs[r].resize(bytes);
    inputs[r] = theirs[r].data();
    ids.push_back(t.Irecv(r, theirs[r].data(), bytes));
  }
  t.Wait(ids, g.NewDeadline(), what);
  ReduceInputs(dtype, op, inputs.data(), inputs.size(), data, count,
               static_cast<std::size_t>(size));
}

void LinearGather(GroupContext& g, const void* input, void* output, std::size_t block,
                  int root, const Label& what) {
  transport::Transport& t = g.transport();
  if (g.rank() != root) {
    t.Wait({t.Isend(root, input, block)}, g.NewDeadline(), what);
    return;
  }
  char* out = static_cast<char*>(output);
  std::vector<transport::RequestId> ids;
  for (int r = 0; r < g.size(); ++r) {
    if (r != root) ids.push_back(t.Irecv(r, out + r * block, block));
  }
  std::memmove(out + root * block, input, block);
  t.Wait(ids, g.NewDeadline(), what);
}

void LinearScatter(GroupContext& g, const void* input, void* output, std::size_t block,
                   int root, const Label& what) {
  transport::Transport& t = g.transport();
  if (g.rank() != root) {
    t.Wait({t.Irecv(root, output, block)}, g.NewDeadline(), what);
    return;
  }
  const char* in = static_cast<const char*>(input);
  std::vector<transport::RequestId> ids;
  for (int r = 0; r < g.size(); ++r) {
    if (r != root) ids.push_back(t.Isend(r, in + r * block, block));
  }
  std::memmove(output, in + root * block, block);
  t.Wait(ids, g.NewDeadline(), what);
}

}  // namespace neuron::collectives
