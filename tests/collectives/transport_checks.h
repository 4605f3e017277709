// Checks shared by the transport tests (shm_transport_test.cc,
// tcp_transport_test.cc): every rank exchanges a known pattern with every
// rank, itself included.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <vector>

#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives::transport::testing {

// The bytes rank `from` sends to rank `to`.
inline std::vector<unsigned char> Pattern(int from, int to, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(from * 31 + to * 7 + i);
  return v;
}

// Sends Pattern(rank, p) to and receives from every rank p at once, for each
// size, and checks what arrived.
inline void ExchangeWithEveryRank(Transport& t, int rank, int size,
                                  const std::vector<std::size_t>& sizes,
                                  std::chrono::milliseconds timeout) {
  for (std::size_t bytes : sizes) {
    std::vector<std::vector<unsigned char>> out(size), in(size);
    std::vector<RequestId> ids;
    for (int p = 0; p < size; ++p) {
      out[p] = Pattern(rank, p, bytes);
      in[p].resize(bytes);
      ids.push_back(t.Isend(p, out[p].data(), bytes));
      ids.push_back(t.Irecv(p, in[p].data(), bytes));
    }
    t.Wait(ids, Deadline::After(timeout), "all-pairs test");
    for (int p = 0; p < size; ++p) {
      ASSERT_EQ(in[p], Pattern(p, rank, bytes)) << "from " << p << " to " << rank;
    }
  }
}

}  // namespace neuron::collectives::transport::testing
