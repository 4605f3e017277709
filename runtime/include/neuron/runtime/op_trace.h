// A rank's operation trace while it is recorded (op_trace.proto): every
// compute charge, every operation issued and every wait on one, in the
// compute stream's program order. SimClock appends the compute charges;
// the communicators append what they issue and fill in each operation's
// collectives and messages as its lane runs it.
//
// Usage:
//   auto trace = std::make_shared<OpTrace>();
//   ProcessClock()->set_trace(trace);   // from now on, recorded
//   ... train ...
//   trace->Save("trace/rank_3.pb", 3, 16, layout);
//   proto::RankTrace t = LoadRankTrace("trace/rank_3.pb");
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "neuron/runtime/op_trace.pb.h"
#include "neuron/runtime/sim_time.h"

namespace neuron::runtime {

class OpTrace {
 public:
  void Compute(SimDuration d);
  // A new issue; returns its index (for AddCollective, AddMessage, Wait).
  std::uint64_t Issue(bool messages_lane, bool waited_at_issue);
  void AddCollective(std::uint64_t issue, proto::TraceCollective collective);
  void AddMessage(std::uint64_t issue, proto::TraceMessage message);
  void Wait(std::uint64_t issue);
  void Mark(const std::string& name);
  // A pipeline structure mark: a TraceMark named "pipeline".
  void Mark(proto::TracePipelineMark mark);
  // The pipeline stage's plan; a later call replaces it (each step sets it).
  void SetPipeline(proto::TracePipeline pipeline);

  proto::RankTrace Snapshot(int rank, int world_size, const proto::TraceLayout& layout) const;
  // Writes the binary proto atomically (WriteFileAtomically); IoError names the path.
  void Save(const std::string& path, int rank, int world_size,
            const proto::TraceLayout& layout) const;

 private:
  proto::TraceIssue& IssueAt(std::uint64_t issue);

  mutable std::mutex mutex_;
  proto::RankTrace trace_;
};

// A task's pipeline mark (TASK_BEGIN or TASK_END) and a layer's.
proto::TracePipelineMark TaskMark(proto::TracePipelineMark::Kind kind, bool forward,
                                  int microbatch, int virtual_stage);
proto::TracePipelineMark LayerMark(int layer, bool forward, int microbatch,
                                   double input_bytes);

// Reads a trace Save wrote; IoError names the path when it is missing or
// not a trace.
proto::RankTrace LoadRankTrace(const std::string& path);
// Writes a trace as OpTrace::Save does (a frame with the checksum, then the
// proto), atomically.
void SaveRankTrace(const proto::RankTrace& trace, const std::string& path);

}  // namespace neuron::runtime
