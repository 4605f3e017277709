#include "neuron/runtime/op_trace.h"

#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::runtime {

void OpTrace::Compute(SimDuration d) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Consecutive charges are one: replay needs only their sum.
  const int n = trace_.ops_size();
  if (n > 0 && trace_.ops(n - 1).has_compute()) {
    auto* c = trace_.mutable_ops(n - 1)->mutable_compute();
    c->set_us(c->us() + d.count());
    return;
  }
  trace_.add_ops()->mutable_compute()->set_us(d.count());
}

std::uint64_t OpTrace::Issue(bool messages_lane, bool waited_at_issue) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* issue = trace_.add_ops()->mutable_issue();
  issue->set_messages_lane(messages_lane);
  issue->set_waited_at_issue(waited_at_issue);
  return static_cast<std::uint64_t>(trace_.ops_size() - 1);
}

proto::TraceIssue& OpTrace::IssueAt(std::uint64_t issue) {
  NEURON_ASSERT(issue < static_cast<std::uint64_t>(trace_.ops_size()) &&
                    trace_.ops(static_cast<int>(issue)).has_issue(),
                "trace op ", issue, " is not an issue");
  return *trace_.mutable_ops(static_cast<int>(issue))->mutable_issue();
}

void OpTrace::AddCollective(std::uint64_t issue, proto::TraceCollective collective) {
  std::lock_guard<std::mutex> lock(mutex_);
  *IssueAt(issue).add_collectives() = std::move(collective);
}

void OpTrace::AddMessage(std::uint64_t issue, proto::TraceMessage message) {
  std::lock_guard<std::mutex> lock(mutex_);
  *IssueAt(issue).add_messages() = std::move(message);
}

void OpTrace::Wait(std::uint64_t issue) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.add_ops()->mutable_wait()->set_issue(issue);
}

void OpTrace::Mark(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_.add_ops()->mutable_mark()->set_name(name);
}

proto::RankTrace OpTrace::Snapshot(int rank, int world_size,
                                   const proto::TraceLayout& layout) const {
  std::lock_guard<std::mutex> lock(mutex_);
  proto::RankTrace out = trace_;
  out.set_rank(rank);
  out.set_world_size(world_size);
  *out.mutable_layout() = layout;
  return out;
}

void OpTrace::Save(const std::string& path, int rank, int world_size,
                   const proto::TraceLayout& layout) const {
  // Serialized protos concatenate into the merge of the two messages: the
  // recorded ops as they are, then rank, world size and layout (which the
  // record never sets), with no copy of the ops as Snapshot would make.
  proto::RankTrace header;
  header.set_rank(rank);
  header.set_world_size(world_size);
  *header.mutable_layout() = layout;
  std::string bytes;
  bool serialized = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    NEURON_ASSERT(trace_.rank() == 0 && trace_.world_size() == 0 && !trace_.has_layout(),
                  "the record sets what Save appends");
    serialized = trace_.AppendToString(&bytes);
  }
  NEURON_CHECK(serialized && header.AppendToString(&bytes),
               "cannot serialize the trace of rank ", rank);
  WriteFileAtomically(path, bytes);
}

proto::RankTrace LoadRankTrace(const std::string& path) {
  proto::RankTrace trace;
  if (!trace.ParseFromString(ReadFile(path, "operation trace"))) {
    throw IoError(StrCat(path, " is not an operation trace (runtime/proto/neuron/runtime/"
                         "op_trace.proto)"));
  }
  return trace;
}

}  // namespace neuron::runtime
