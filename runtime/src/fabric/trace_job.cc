#include "neuron/runtime/fabric/trace_job.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_names.h"

namespace neuron::runtime {

namespace {

// Throws InvalidUsage naming the rank and op unless every figure and index
// of trace `t` (of a job of `world` ranks) is one the replay can follow: a
// trace is a file, and a file may have been damaged or made by hand.
void CheckTraceContents(const proto::RankTrace& t, int world) {
  constexpr double kMaxUs = 1e12, kMaxBytes = 1e18;
  auto where = [&](int i) { return StrCat("trace of rank ", t.rank(), ": op ", i); };
  for (int i = 0; i < t.ops_size(); ++i) {
    const proto::TraceOp& op = t.ops(i);
    if (op.has_compute()) {
      NEURON_CHECK(std::isfinite(op.compute().us()) && op.compute().us() >= 0 &&
                       op.compute().us() <= kMaxUs,
                   where(i), ": compute of ", op.compute().us(), " us");
    }
    for (const auto& c : op.issue().collectives()) {
      NEURON_CHECK(c.group_size() >= 1 && c.group_size() <= world, where(i),
                   ": a group of ", c.group_size(), " ranks in a job of ", world);
      // Sorted, so a group costs O(g log g), not O(world).
      std::vector<int> members(c.group().begin(), c.group().end());
      std::sort(members.begin(), members.end());
      bool self = false;
      for (std::size_t k = 0; k < members.size(); ++k) {
        const int g = members[k];
        NEURON_CHECK(g >= 0 && g < world && (k == 0 || members[k - 1] != g), where(i),
                     ": group member ", g, " is outside the job or listed twice");
        self |= g == t.rank();
      }
      NEURON_CHECK(self, where(i), ": a collective whose group lacks the rank itself");
      NEURON_CHECK(c.root() >= 0 && c.root() < c.group_size(), where(i), ": root ",
                   c.root(), " outside its group of ", c.group_size());
      NEURON_CHECK(std::isfinite(c.bytes()) && c.bytes() >= 0 && c.bytes() <= kMaxBytes,
                   where(i), ": a collective of ", c.bytes(), " bytes");
      NEURON_CHECK(ParseCollectiveKind(c.kind()).has_value() || c.kind() == "gather" ||
                       c.kind() == "scatter",
                   where(i), ": unknown collective '", c.kind(), "'");
    }
    for (const auto& m : op.issue().messages()) {
      NEURON_CHECK(m.peer() >= 0 && m.peer() < world && m.peer() != t.rank(), where(i),
                   ": a message with peer ", m.peer());
      NEURON_CHECK(std::isfinite(m.bytes()) && m.bytes() >= 0 && m.bytes() <= kMaxBytes,
                   where(i), ": a message of ", m.bytes(), " bytes");
    }
  }
}

}  // namespace

Mesh CheckJobTraces(const std::vector<proto::RankTrace>& traces) {
  NEURON_CHECK(!traces.empty(), "no traces to replay");
  const auto& l = traces[0].layout();
  const Mesh mesh{std::max(l.tp(), 1), std::max(l.pp(), 1), std::max(l.dp(), 1)};
  const int world = traces[0].world_size();
  NEURON_CHECK(static_cast<int>(traces.size()) == world, "the traces are of ",
               traces.size(), " ranks but rank ", traces[0].rank(), " recorded a job of ",
               world);
  NEURON_CHECK(mesh.tp <= world && mesh.pp <= world && mesh.dp <= world &&
                   std::int64_t{mesh.tp} * mesh.pp * mesh.dp == world,
               "recorded layout tp=", mesh.tp, " x pp=", mesh.pp, " x dp=", mesh.dp,
               " is not the job's ", world, " ranks");
  NEURON_CHECK(l.ep() >= 0 && l.ep() <= mesh.tp && mesh.tp % std::max(l.ep(), 1) == 0,
               "recorded layout ep=", l.ep(), " does not divide its tp=", mesh.tp,
               " positions");
  for (int r = 0; r < world; ++r) {
    const auto& t = traces[static_cast<std::size_t>(r)];
    NEURON_CHECK(t.rank() == r, "trace ", r, " is of rank ", t.rank(),
                 ": give one trace per rank, in rank order");
    NEURON_CHECK(t.world_size() == world && t.layout().tp() == l.tp() &&
                     t.layout().pp() == l.pp() && t.layout().dp() == l.dp() &&
                     t.layout().ep() == l.ep(),
                 "the trace of rank ", r, " is of another job (world or layout differs)");
    CheckTraceContents(t, world);
  }
  return mesh;
}

}  // namespace neuron::runtime
