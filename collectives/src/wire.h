// The collectives' shared vocabulary, below the communicator: the op codes,
// the call header every collective shows the other ranks and what the
// ranks agree from it (handshake.h), the shared windows' layout and phase
// counters, the point-to-point message header, and the chunking helpers.
// The algorithms (algorithms.h), the handshake and the accounting
// (op_accounting.h) take their words from here; nothing here knows the
// Communicator.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "neuron/collectives/dtype.h"
#include "neuron/runtime/fnv.h"

namespace neuron::collectives {
namespace detail {

enum class OpCode : std::uint8_t {
  kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier,
  kReduce, kGather, kScatter, kAllToAll, kAllGatherV,
};

inline const char* OpName(OpCode op) {
  switch (op) {
    case OpCode::kAllReduce: return "allreduce";
    case OpCode::kBroadcast: return "broadcast";
    case OpCode::kAllGather: return "allgather";
    case OpCode::kReduceScatter: return "reducescatter";
    case OpCode::kBarrier: return "barrier";
    case OpCode::kReduce: return "reduce";
    case OpCode::kGather: return "gather";
    case OpCode::kScatter: return "scatter";
    case OpCode::kAllToAll: return "alltoall";
    case OpCode::kAllGatherV: return "allgatherv";
  }
  return "unknown";
}

// Element range [Begin(c), Begin(c + 1)) of chunk c when `count` elements are
// split into `n` chunks as evenly as possible.
inline std::size_t Begin(std::size_t count, int n, int c) {
  return count * static_cast<std::size_t>(c) / static_cast<std::size_t>(n);
}

inline int Mod(int a, int n) { return ((a % n) + n) % n; }

// Phase counters of the shm transport (see ShmTransport::PublishPhase).
// (Phase 0 is unused: the headers' `published` words flag the handshake.)
inline constexpr int kReducedPhase = 1;    // each rank's slice is reduced
inline constexpr int kCollectedPhase = 2;  // the window data areas may be reused
inline constexpr int kStagedPhase = 3;     // inputs are staged (large direct allreduce)
// Each window starts with two header slots (by sequence parity: a rank can
// be at most one collective ahead of any other), then the data area. A
// slot holds the header and, after it, up to kInlineBytes of an allreduce's
// data: a rank writes slot s at collective n only after every rank
// published its handshake of collective n - 1, which each does after it
// finished reading slot s at collective n - 2, so inline data needs no
// "collected" phase (the data area does).
inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kInlineBytes = 960;
inline constexpr std::size_t kHeaderSlot = kHeaderBytes + kInlineBytes;
inline constexpr std::size_t kWindowDataOffset = 2 * kHeaderSlot;
// Header::path values.
inline constexpr std::uint8_t kPathAlgorithm = 0;   // as the algorithm says
inline constexpr std::uint8_t kPathStaged = 1;      // staged in the windows (small direct)
inline constexpr std::uint8_t kPathHeaderSlot = 2;  // in the header slots (kInlineBytes at most)
inline constexpr std::uint8_t kPathHeaderLine = 3;  // in the header itself (kTinyBytes at most)
// An allreduce of at most this many bytes travels in its header
// (Header::tiny), in the flag's cache line: a peer that saw the flag has
// the data too, one cache line per rank and collective.
inline constexpr std::size_t kTinyBytes = 8;
// The count of an all-to-all whose blocks differ per peer. An all-to-all's
// ranks may show different counts (each its own form: equal blocks of a
// count or per-peer sizes); they agree on the form from Agreed.
inline constexpr std::uint64_t kPerPeerSizes = ~std::uint64_t{0};

// The call every collective shows the other ranks (handshake.h).
struct Header {
  std::uint32_t magic = 0x4e43434c;  // "NCCL"-like tag: a header, not data
  OpCode op = OpCode::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  std::uint8_t algorithm = 0;  // Algorithm, where the call names or picks one
  // How the data travels where ranks could choose differently (their
  // options): kPathAlgorithm, kPathStaged, kPathHeaderSlot or kPathHeaderLine.
  std::uint8_t path = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  // FNV-1a of the per-rank block sizes every rank passes (uneven allgather
  // and reduce-scatter), 0 otherwise.
  std::uint64_t fingerprint = 0;
  // Not compared: they differ between ranks.
  double arrival_us = 0;   // this rank's simulated arrival
  double model_bytes = 0;  // this rank's size for the fabric model
  // A kPathHeaderLine allreduce's data (this rank's input).
  alignas(8) unsigned char tiny[kTinyBytes] = {};
  // The collective's sequence number on the communicator + 1 (so 0 is
  // none). With shared memory, the handshake's flag: stored once the rest of
  // the header is written (ShmTransport::SyncWindowWord), in the header's
  // cache line, so a waiting peer moves that line only. Last member: the
  // header is written without it.
  std::uint64_t published = 0;

  std::uint64_t sequence() const { return published - 1; }

  // Equal calls (the per-rank stamps aside). An all-to-all's counts may
  // differ: each rank's blocks are its own (what rank a sends b must equal
  // what b expects from a, which the algorithm checks when the counts
  // differ; Agreed::SameCount).
  bool operator==(const Header& o) const {
    return magic == o.magic && op == o.op && dtype == o.dtype && reduce == o.reduce &&
           algorithm == o.algorithm && path == o.path && root == o.root &&
           published == o.published &&
           (count == o.count || op == OpCode::kAllToAll) && fingerprint == o.fingerprint;
  }
};

// What the handshake agreed: the latest arrival, the largest model size and
// the range of the headers' counts over the ranks. The handshake combines
// them by maximum (the smallest count as the maximum of its complement) in
// the exchanges it makes anyway: no message of its own.
struct Agreed {
  double start_us = 0;
  double model_bytes = 0;
  std::uint64_t count_max = 0;
  std::uint64_t count_min_complement = 0;  // ~(the smallest count)

  // Whether every rank's header showed the same count.
  bool SameCount() const { return count_max == ~count_min_complement; }
  void Combine(const Agreed& o) {
    start_us = std::max(start_us, o.start_us);
    model_bytes = std::max(model_bytes, o.model_bytes);
    count_max = std::max(count_max, o.count_max);
    count_min_complement = std::max(count_min_complement, o.count_min_complement);
  }
};

}  // namespace detail

// FNV-1a over block sizes: equal vectors give equal fingerprints.
inline std::uint64_t Fingerprint(const std::vector<std::size_t>& counts) {
  return counts.empty() ? 0 : runtime::Fnv1a(counts.data(), counts.size() * sizeof(std::size_t));
}

namespace detail {

struct MessageHeader {
  std::uint32_t magic = 0x4e503250;  // "NP2P"
  std::uint32_t pad = 0;
  std::uint64_t tag = 0;
  std::uint64_t bytes = 0;
  double send_us = 0;  // the sender's simulated time
};

struct Message {
  MessageHeader header;
  std::vector<char> payload;
};

}  // namespace detail

}  // namespace neuron::collectives
