#include "neuron/runtime/op_trace.h"

#include <cstdio>

#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/fnv.h"

namespace neuron::runtime {

namespace {

constexpr char kTraceMagic[8] = {'N', 'T', 'R', 'A', 'C', 'E', '1', '\n'};

// What a trace file starts with: the magic and the checksum of `body`.
std::string TraceFrame(const std::string& body) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(Fnv1a(body.data(), body.size())));
  return std::string(kTraceMagic, sizeof(kTraceMagic)) + hex;
}

}  // namespace

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

void OpTrace::Mark(proto::TracePipelineMark mark) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* m = trace_.add_ops()->mutable_mark();
  m->set_name("pipeline");
  *m->mutable_pipeline() = std::move(mark);
}

proto::TracePipelineMark TaskMark(proto::TracePipelineMark::Kind kind, bool forward,
                                  int microbatch, int virtual_stage) {
  proto::TracePipelineMark m;
  m.set_kind(kind);
  m.set_forward(forward);
  m.set_microbatch(microbatch);
  m.set_virtual_stage(virtual_stage);
  return m;
}

proto::TracePipelineMark LayerMark(int layer, bool forward, int microbatch,
                                   double input_bytes) {
  proto::TracePipelineMark m;
  m.set_kind(proto::TracePipelineMark::LAYER_BEGIN);
  m.set_layer(layer);
  m.set_forward(forward);
  m.set_microbatch(microbatch);
  m.set_input_bytes(input_bytes);
  return m;
}

void OpTrace::SetPipeline(proto::TracePipeline pipeline) {
  std::lock_guard<std::mutex> lock(mutex_);
  *trace_.mutable_pipeline() = std::move(pipeline);
}

namespace {

// What a saved trace adds to the record: the rank, the job's size and layout.
proto::RankTrace JobFields(int rank, int world_size, const proto::TraceLayout& layout) {
  proto::RankTrace fields;
  fields.set_rank(rank);
  fields.set_world_size(world_size);
  *fields.mutable_layout() = layout;
  return fields;
}

}  // namespace

proto::RankTrace OpTrace::Snapshot(int rank, int world_size,
                                   const proto::TraceLayout& layout) const {
  proto::RankTrace out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out = trace_;
  }
  out.MergeFrom(JobFields(rank, world_size, layout));
  return out;
}

void OpTrace::Save(const std::string& path, int rank, int world_size,
                   const proto::TraceLayout& layout) const {
  // Serialized protos concatenate into the merge of the two messages (as
  // Snapshot merges them): the recorded ops as they are, then the job's
  // fields, which the record never sets; no copy of the ops.
  std::string bytes;
  bool serialized = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    NEURON_ASSERT(trace_.rank() == 0 && trace_.world_size() == 0 && !trace_.has_layout(),
                  "the record sets what Save appends");
    serialized = trace_.AppendToString(&bytes);
  }
  NEURON_CHECK(serialized && JobFields(rank, world_size, layout).AppendToString(&bytes),
               "cannot serialize the trace of rank ", rank);
  WriteFileAtomically(path, TraceFrame(bytes) + bytes);
}

void SaveRankTrace(const proto::RankTrace& trace, const std::string& path) {
  std::string bytes;
  NEURON_CHECK(trace.SerializeToString(&bytes), "cannot serialize the trace of rank ",
               trace.rank());
  WriteFileAtomically(path, TraceFrame(bytes) + bytes);
}

proto::RankTrace LoadRankTrace(const std::string& path) {
  const std::string file = ReadFile(path, "operation trace");
  const std::size_t head = sizeof(kTraceMagic) + 16;
  // The frame: magic, then the FNV-1a of the proto after it, in hex.
  if (file.size() < head || file.compare(0, head, TraceFrame(file.substr(head))) != 0) {
    throw IoError(StrCat(path, " is not an operation trace, or was changed after it was "
                         "written (its frame or checksum does not match)"));
  }
  proto::RankTrace trace;
  if (!trace.ParseFromArray(file.data() + head, static_cast<int>(file.size() - head))) {
    throw IoError(StrCat(path, " is not an operation trace (runtime/proto/neuron/runtime/"
                         "op_trace.proto)"));
  }
  return trace;
}

}  // namespace neuron::runtime
