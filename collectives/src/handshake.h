// The call check every collective starts with: each rank shows the others
// a small header (op, sequence number, count, dtype, reduce op, root,
// algorithm and data path; communicator_internal.h) and checks theirs. A
// rank that sees another rank's call differ aborts the group and throws
// InvalidUsage naming both calls, so no rank hangs or reads mismatched
// data. The ranks also agree on the operation's simulated start (the
// latest arrival), model size (the largest) and whether every rank showed
// the same count (an all-to-all's form).
//
// On shared memory the headers go in slots at the start of every rank's
// window (two, by sequence parity: a rank can be at most one collective
// ahead of any other), and a small allreduce's data may travel with them
// (Header::path). Over TCP they go around the ring; with NEURON_CC_DEBUG=1
// every rank sees every header, and the error names every rank differing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "neuron/collectives/group_context.h"
#include "neuron/collectives/transport/transport.h"
#include "neuron/collectives/tuner.h"
#include "wire.h"

namespace neuron::collectives::detail {

using transport::Label;

class Handshake {
 public:
  explicit Handshake(GroupContext& group);

  // The header of the next collective (its sequence number).
  Header Next(OpCode op, DataType dtype, std::uint64_t count,
              ReduceOp reduce = ReduceOp::kSum, int root = -1) const;
  // Shows every rank this call and checks theirs; throws on mismatch.
  // Stamps the header with `arrival_us`. `staged` (at most the window's
  // data size) is copied into this rank's window data area first, so a
  // small direct allreduce needs no phase of its own; when mine.path is
  // kPathHeaderSlot (at most kInlineBytes) into the header's slot instead
  // (InlineData), which needs no "collected" phase, and when
  // kPathHeaderLine (at most kTinyBytes) into the header itself (TinyData).
  // `slot_data` (at most kInlineBytes) goes into this rank's header slot
  // with the header, for the ranks to read until the next collective.
  Agreed Run(Header& mine, double arrival_us, const void* staged = nullptr,
             std::size_t staged_bytes = 0, const void* slot_data = nullptr,
             std::size_t slot_bytes = 0);
  // Collectives begun so far (the next one gets this number).
  std::uint64_t sequence() const { return sequence_; }
  // Where rank `rank` put the current collective's slot data. Shared memory only.
  char* InlineData(int rank) const;
  // Rank `rank`'s kPathHeaderLine data, in its current header.
  const unsigned char* TinyData(int rank) const;

  // A label that describes `h` (which must outlive it) when a message needs it.
  static Label Describing(const Header& h);
  static std::string Describe(const void* header);

 private:
  Agreed ShmRun(Header& mine, Agreed agreed, const void* staged, std::size_t staged_bytes,
                const void* slot_data, std::size_t slot_bytes);
  Agreed RingRun(const Header& mine, Agreed agreed);
  // Circulates the maxima of Agreed (arrival, model bytes, count range)
  // around the ring (TCP).
  Agreed RingMax(Agreed mine, const Label& what);
  void Check(const Header& mine, const Header* const* theirs);
  // The current collective's header slot in every window.
  std::size_t SlotOffset() const { return (sequence_ % 2) * kHeaderSlot; }

  GroupContext& group_;
  bool debug_ = false;  // NEURON_CC_DEBUG=1
  std::uint64_t sequence_ = 0;
  std::vector<const Header*> views_;  // ShmRun's, reused
};

}  // namespace neuron::collectives::detail
