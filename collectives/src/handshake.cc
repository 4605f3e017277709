#include "handshake.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "neuron/collectives/transport/shared_windows.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives::detail {

Handshake::Handshake(GroupContext& group)
    : group_(group),
      debug_(runtime::ConfigRegistry::Get()
                 .Find(runtime::ConfigKey::kCollectiveDebug)
                 .value_or("0") == "1") {}

Header Handshake::Next(OpCode op, DataType dtype, std::uint64_t count, ReduceOp reduce,
                       int root) const {
  Header h;
  h.op = op;
  h.dtype = dtype;
  h.count = count;
  h.reduce = reduce;
  h.root = root;
  h.published = sequence_ + 1;
  return h;
}

Label Handshake::Describing(const Header& h) { return Label(&Describe, &h); }

// Made only for messages (errors, records), built with appends rather than
// StrCat's stream.
std::string Handshake::Describe(const void* header) {
  const Header& h = *static_cast<const Header*>(header);
  std::string text;
  text.reserve(96);
  text.append(OpName(h.op)).append(" #").append(std::to_string(h.sequence()));
  if (h.op != OpCode::kBarrier) {
    text.append(" of ")
        .append(h.count == kPerPeerSizes ? "per-peer sizes of" : std::to_string(h.count))
        .append(" ")
        .append(Name(h.dtype));
  }
  if (h.op == OpCode::kAllReduce || h.op == OpCode::kReduceScatter ||
      h.op == OpCode::kReduce) {
    text.append(" (").append(Name(h.reduce)).append(")");
  }
  if (h.root >= 0) text.append(" with root ").append(std::to_string(h.root));
  if (h.fingerprint != 0) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%llx",
                  static_cast<unsigned long long>(h.fingerprint));
    text.append(" (block sizes ").append(hex).append(")");
  }
  if (h.op == OpCode::kAllReduce) {
    text.append(" by ").append(Name(static_cast<Algorithm>(h.algorithm)));
    if (h.path == kPathStaged) text.append(" (staged)");
    if (h.path == kPathHeaderSlot) text.append(" (in the header slots)");
    if (h.path == kPathHeaderLine) text.append(" (in the header line)");
  }
  return text;
}

void Handshake::Check(const Header& mine, const Header* const* theirs) {
  const int rank = group_.rank(), size = group_.size();
  std::vector<int> differ;
  for (int r = 0; r < size; ++r) {
    if (!(*theirs[r] == mine)) differ.push_back(r);
  }
  if (differ.empty()) return;
  std::string message =
      StrCat("mismatched collectives: rank ", rank, " called ", Describe(&mine),
             " but rank ", differ[0], " called ", Describe(theirs[differ[0]]));
  if (debug_) {
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    message +=
        StrCat(" (NEURON_CC_DEBUG: ranks differing from rank ", rank, ": ", ranks, ")");
  }
  group_.transport().Abort(message);
  throw InvalidUsage(message);
}

char* Handshake::InlineData(int rank) const {
  return group_.windows()->Window(rank) + SlotOffset() + kHeaderBytes;
}

const unsigned char* Handshake::TinyData(int rank) const {
  return reinterpret_cast<const Header*>(group_.windows()->Window(rank) + SlotOffset())
      ->tiny;
}

Agreed Handshake::Run(Header& mine, double arrival_us, const void* staged,
                      std::size_t staged_bytes, const void* slot_data,
                      std::size_t slot_bytes) {
  ++sequence_;
  mine.arrival_us = arrival_us;
  const Agreed agreed{mine.arrival_us, mine.model_bytes, mine.count, ~mine.count};
  if (group_.size() == 1) return agreed;
  if (group_.windows() != nullptr) {
    return ShmRun(mine, agreed, staged, staged_bytes, slot_data, slot_bytes);
  }
  return RingRun(mine, agreed);
}

Agreed Handshake::ShmRun(Header& mine, Agreed agreed, const void* staged,
                         std::size_t staged_bytes, const void* slot_data,
                         std::size_t slot_bytes) {
  const int rank = group_.rank(), size = group_.size();
  transport::SharedWindows& windows = *group_.windows();
  const Label what = Describing(mine);
  const std::size_t slot = SlotOffset();
  static_assert(sizeof(Header) <= kHeaderBytes, "header slot too small");
  if (mine.path == kPathHeaderLine) {
    NEURON_CHECK(staged_bytes <= kTinyBytes, what, ": ", staged_bytes,
                 " bytes do not fit a header");
    if (staged_bytes > 0) std::memcpy(mine.tiny, staged, staged_bytes);
  } else if (mine.path == kPathHeaderSlot) {
    NEURON_CHECK(staged_bytes <= kInlineBytes, what, ": ", staged_bytes,
                 " bytes do not fit a header slot");
    if (staged_bytes > 0) std::memcpy(InlineData(rank), staged, staged_bytes);
  } else if (staged_bytes > 0) {
    // The data area is free once every rank collected its last use.
    windows.WaitPhase(kCollectedPhase, group_.window_sequence(), group_.NewDeadline(),
                      what);
    std::memcpy(group_.WindowData(rank), staged, staged_bytes);
  }
  if (slot_bytes > 0) {
    NEURON_ASSERT(mine.path != kPathHeaderSlot && slot_bytes <= kInlineBytes, what,
                  ": slot data does not fit");
    std::memcpy(InlineData(rank), slot_data, slot_bytes);
  }
  // The header's `published`, stored last, is the handshake's flag: a
  // peer polls the header's own cache line.
  // Everything but the flag, which peers may be reading (atomically).
  static_assert(offsetof(Header, published) + sizeof(Header::published) == sizeof(Header),
                "Header::published must be its last member");
  // The flag's store follows the header's at once: a peer polling the line
  // between the two would take it back, and the flag store would wait for
  // the line a second time.
  NEURON_ASSERT(mine.published == sequence_, what,
                ": header made for another collective");
  const std::size_t flag = slot + offsetof(Header, published);
  const transport::Deadline deadline = group_.NewDeadline();
  std::memcpy(windows.Window(rank) + slot, &mine, offsetof(Header, published));
  windows.SyncWindowWord(flag, mine.published, deadline, what);
  if (mine.path == kPathHeaderSlot) {
    // The headers' lines are here (their flags were); start fetching the
    // inline data now, while the headers are checked.
    for (int r = 0; r < size; ++r) __builtin_prefetch(InlineData(r));
  }
  views_.resize(static_cast<std::size_t>(size));
  const Header** theirs = views_.data();
  for (int r = 0; r < size; ++r) {
    // This rank's own from its local copy: the shared line may still wait
    // in the store buffer for the cache line (peers poll it), and a load
    // from it would wait too.
    theirs[r] =
        r == rank ? &mine : reinterpret_cast<const Header*>(windows.Window(r) + slot);
    agreed.Combine({theirs[r]->arrival_us, theirs[r]->model_bytes, theirs[r]->count,
                    ~theirs[r]->count});
  }
  Check(mine, theirs);
  return agreed;
}

Agreed Handshake::RingRun(const Header& mine, Agreed agreed) {
  const int rank = group_.rank(), size = group_.size();
  const int right_rank = Mod(rank + 1, size), left_rank = Mod(rank - 1, size);
  if (debug_) {  // every rank sees every header: a ring allgather of them
    std::vector<Header> all(size);
    all[rank] = mine;
    for (int k = 0; k < size - 1; ++k) {
      group_.Exchange(right_rank, &all[Mod(rank - k, size)], sizeof(Header), left_rank,
                      &all[Mod(rank - k - 1, size)], sizeof(Header), Describing(mine));
    }
    std::vector<const Header*> theirs(size);
    for (int r = 0; r < size; ++r) theirs[r] = &all[r];
    Check(mine, theirs.data());
    return RingMax(agreed, Describing(mine));
  }
  Header left;
  group_.Exchange(right_rank, &mine, sizeof(mine), left_rank, &left, sizeof(left),
                  Describing(mine));
  if (!(left == mine)) {
    std::vector<const Header*> theirs(size, &mine);
    theirs[left_rank] = &left;
    Check(mine, theirs.data());
  }
  return RingMax(agreed, Describing(mine));
}

Agreed Handshake::RingMax(Agreed mine, const Label& what) {
  const int rank = group_.rank(), size = group_.size();
  // n-1 steps: after step k each rank holds the maximum over k+2 ranks.
  const int right = Mod(rank + 1, size), left = Mod(rank - 1, size);
  Agreed current = mine;
  for (int k = 0; k < size - 1; ++k) {
    Agreed in;
    group_.Exchange(right, &current, sizeof(current), left, &in, sizeof(in), what);
    current.Combine(in);
  }
  return current;
}

}  // namespace neuron::collectives::detail
