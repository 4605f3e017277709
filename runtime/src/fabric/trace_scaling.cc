#include "neuron/runtime/fabric/trace_scaling.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/trace_job.h"

namespace neuron::runtime {

namespace {

// A recording and its mesh; rank (t, d, p) of a job at another tp or dp
// reads the recorded rank at (t mod tp, d mod dp, p).
struct Recording {
  const std::vector<proto::RankTrace>* traces = nullptr;
  Mesh mesh{1, 1, 1};
  const proto::RankTrace& At(int t, int d, int p) const {
    return (*traces)[static_cast<std::size_t>(mesh.Rank(t % mesh.tp, p, d % mesh.dp))];
  }
};

// The coordinates a recorded group holds on each axis; whether it spans
// the tensor-parallel axis is unknown in a recording at tp = 1.
struct GroupShape {
  std::set<int> t, d, p;
  std::optional<bool> spans_tp;
};

const char* OpName(const proto::TraceOp& op) {
  switch (op.op_case()) {
    case proto::TraceOp::kCompute:
      return "compute";
    case proto::TraceOp::kIssue:
      return "issue";
    case proto::TraceOp::kWait:
      return "wait";
    case proto::TraceOp::kMark:
      return "mark";
    default:
      return "empty op";
  }
}

// One op of a target rank's two sources (for messages, built on failure).
struct Site {
  const proto::RankTrace& x;  // in the recording whose layout is kept
  const proto::RankTrace& y;  // in the other
  int op;
};

class Scaler {
 public:
  Scaler(Recording s, Recording o, int tp)
      : s_(s), o_(o), to_{tp, s.mesh.pp, s.mesh.dp} {}

  const Mesh& target() const { return to_; }

  // Target rank r's trace, op by op from the two recordings.
  proto::RankTrace Rank(int r) const {
    const int t = to_.Tensor(r), d = to_.Data(r), p = to_.Pipeline(r);
    const proto::RankTrace& x = s_.At(t, d, p);
    const proto::RankTrace& y = o_.At(t, d, p);
    proto::RankTrace out;
    out.set_rank(r);
    out.set_world_size(to_.world());
    out.mutable_layout()->set_tp(to_.tp);
    out.mutable_layout()->set_pp(to_.pp);
    out.mutable_layout()->set_dp(to_.dp);
    out.mutable_ops()->Reserve(x.ops_size());
    const int n = std::min(x.ops_size(), y.ops_size());
    for (int i = 0; i < n; ++i) *out.add_ops() = Op({x, y, i}, r);
    NEURON_CHECK(x.ops_size() == y.ops_size(), Differ({x, y, n}),
                 ": one trace ends there");
    if (x.has_pipeline() || y.has_pipeline()) *out.mutable_pipeline() = Plan(x, y);
    return out;
  }

 private:
  // Where the recordings part ways.
  std::string Differ(const Site& at) const {
    return StrCat("the recordings at tp=", s_.mesh.tp, " and tp=", o_.mesh.tp,
                  " run different programs (op ", at.op, " of their ranks ", at.x.rank(),
                  " and ", at.y.rank(), ")");
  }

  // An op of one recording (`kept`: the one whose layout is kept).
  std::string In(bool kept, const Site& at) const {
    return StrCat("the recording at tp=", (kept ? s_ : o_).mesh.tp, ": op ", at.op,
                  " of rank ", (kept ? at.x : at.y).rank());
  }

  // Amdahl's law through the two recordings, at the target tp.
  double Fit(double sv, double ov) const {
    const double parallel = (sv - ov) / (1.0 / s_.mesh.tp - 1.0 / o_.mesh.tp);
    const double serial = sv - parallel / s_.mesh.tp;
    return std::max(0.0, serial + parallel / to_.tp);
  }

  proto::TraceOp Op(const Site& at, int r) const {
    const proto::TraceOp& u = at.x.ops(at.op);
    const proto::TraceOp& v = at.y.ops(at.op);
    NEURON_CHECK(u.op_case() == v.op_case(), Differ(at), ": ", OpName(u), " against ",
                 OpName(v));
    proto::TraceOp out = u;
    if (u.has_compute()) {
      out.mutable_compute()->set_us(Fit(u.compute().us(), v.compute().us()));
    } else if (u.has_mark()) {
      *out.mutable_mark() = Mark(u.mark(), v.mark(), at);
    } else if (u.has_wait()) {
      NEURON_CHECK(u.wait().issue() == v.wait().issue(), Differ(at), ": a wait for op ",
                   u.wait().issue(), " against op ", v.wait().issue());
    } else if (u.has_issue()) {
      const proto::TraceIssue& a = u.issue();
      const proto::TraceIssue& b = v.issue();
      NEURON_CHECK(a.messages_lane() == b.messages_lane() &&
                       a.waited_at_issue() == b.waited_at_issue() &&
                       a.collectives_size() == b.collectives_size() &&
                       a.messages_size() == b.messages_size(),
                   Differ(at), ": issues of different lanes or parts");
      for (int k = 0; k < a.collectives_size(); ++k) {
        *out.mutable_issue()->mutable_collectives(k) =
            Collective(a.collectives(k), b.collectives(k), r, at);
      }
      for (int k = 0; k < a.messages_size(); ++k) {
        *out.mutable_issue()->mutable_messages(k) =
            Message(a.messages(k), b.messages(k), r, at);
      }
    }
    return out;
  }

  // The pipeline plan at the target tp: the same layers and schedule, their
  // costs (parameter counts, by default) and gradient bytes fitted.
  proto::TracePipeline Plan(const proto::RankTrace& x, const proto::RankTrace& y) const {
    const proto::TracePipeline &a = x.pipeline(), &b = y.pipeline();
    const bool same = a.schedule() == b.schedule() &&
                      a.microbatches() == b.microbatches() && a.chunks() == b.chunks() &&
                      a.layer_costs_size() == b.layer_costs_size() &&
                      a.layers_size() == b.layers_size();
    NEURON_CHECK(same, "the recordings at tp=", s_.mesh.tp, " and tp=", o_.mesh.tp,
                 " have different pipeline plans (ranks ", x.rank(), " and ", y.rank(),
                 ")");
    proto::TracePipeline out = a;
    for (int i = 0; i < a.layer_costs_size(); ++i) {
      out.set_layer_costs(i, Fit(a.layer_costs(i), b.layer_costs(i)));
    }
    for (int i = 0; i < a.layers_size(); ++i) {
      NEURON_CHECK(a.layers(i).index() == b.layers(i).index(),
                   "the recordings at tp=", s_.mesh.tp, " and tp=", o_.mesh.tp,
                   " place different layers on ranks ", x.rank(), " and ", y.rank());
      out.mutable_layers(i)->set_gradient_bytes(
          Fit(a.layers(i).gradient_bytes(), b.layers(i).gradient_bytes()));
    }
    return out;
  }

  // A pipeline layer's input is tp-sharded with sequence parallelism.
  proto::TraceMark Mark(const proto::TraceMark& a, const proto::TraceMark& b,
                        const Site& at) const {
    const proto::TracePipelineMark &p = a.pipeline(), &q = b.pipeline();
    NEURON_CHECK(a.name() == b.name() && a.has_pipeline() == b.has_pipeline() &&
                     p.kind() == q.kind() && p.forward() == q.forward() &&
                     p.microbatch() == q.microbatch() &&
                     p.virtual_stage() == q.virtual_stage() && p.layer() == q.layer(),
                 Differ(at), ": mark '", a.name(), "' against '", b.name(), "'",
                 a.has_pipeline() ? " (or their pipeline places)" : "");
    proto::TraceMark out = a;
    if (a.has_pipeline()) {
      out.mutable_pipeline()->set_input_bytes(Fit(p.input_bytes(), q.input_bytes()));
    }
    return out;
  }

  GroupShape Shape(const proto::TraceCollective& c, bool kept, const Site& at) const {
    const Mesh& m = (kept ? s_ : o_).mesh;
    GroupShape g;
    for (int member : c.group()) {
      g.t.insert(m.Tensor(member));
      g.d.insert(m.Data(member));
      g.p.insert(m.Pipeline(member));
    }
    NEURON_CHECK(
        g.t.size() * g.d.size() * g.p.size() == static_cast<std::size_t>(c.group_size()),
        In(kept, at), ": the ", c.kind(), " on communicator ", c.communicator(),
        " has a group that is not a block of the mesh");
    NEURON_CHECK(g.t.size() == 1 || static_cast<int>(g.t.size()) == m.tp, In(kept, at),
                 ": the ", c.kind(), " on communicator ", c.communicator(),
                 " spans part of the tensor-parallel axis (", g.t.size(), " of ", m.tp,
                 " positions)");
    if (m.tp > 1) g.spans_tp = static_cast<int>(g.t.size()) == m.tp;
    return g;
  }

  // Whether the groups hold the same place on the data-parallel and
  // pipeline axes (the other recording's replica d is the kept one's
  // d mod its dp; a recording of one replica cannot tell).
  bool SamePlace(const GroupShape& a, const GroupShape& b) const {
    std::set<int> folded;
    for (int d : a.d) folded.insert(d % o_.mesh.dp);
    const bool whole_a = a.d.size() == static_cast<std::size_t>(s_.mesh.dp);
    const bool whole_b = b.d.size() == static_cast<std::size_t>(o_.mesh.dp);
    const bool data = o_.mesh.dp == 1 || s_.mesh.dp == 1 || (whole_a && whole_b) ||
                      (!whole_a && !whole_b && folded == b.d);
    return data && a.p == b.p;
  }

  proto::TraceCollective Collective(const proto::TraceCollective& a,
                                    const proto::TraceCollective& b, int r,
                                    const Site& at) const {
    const GroupShape sa = Shape(a, true, at), sb = Shape(b, false, at);
    NEURON_CHECK(a.kind() == b.kind() && SamePlace(sa, sb) &&
                     (!sa.spans_tp || !sb.spans_tp || *sa.spans_tp == *sb.spans_tp),
                 Differ(at), ": ", a.kind(), " on communicator ", a.communicator(),
                 " against ", b.kind(), " on communicator ", b.communicator());
    const bool spans = sa.spans_tp.value_or(sb.spans_tp.value_or(false));
    std::vector<int> group;
    for (int p : sa.p) {
      for (int d : sa.d) {
        for (int t = 0; t < to_.tp; ++t) {
          if (spans || t == to_.Tensor(r)) group.push_back(to_.Rank(t, p, d));
        }
      }
    }
    std::sort(group.begin(), group.end());
    // The root's tensor position: the rank's own in a group at one position,
    // else the recorded one (from the other recording when the kept one,
    // at tp = 1, has a single position).
    const int g = a.group(a.root());
    int root_t = to_.Tensor(r);
    if (spans && s_.mesh.tp > 1) root_t = s_.mesh.Tensor(g) % to_.tp;
    if (spans && s_.mesh.tp == 1) root_t = o_.mesh.Tensor(b.group(b.root())) % to_.tp;
    const int root = to_.Rank(root_t, s_.mesh.Pipeline(g), s_.mesh.Data(g));
    proto::TraceCollective out = a;
    out.clear_group();
    for (int member : group) out.add_group(member);
    out.set_root(
        static_cast<int>(std::find(group.begin(), group.end(), root) - group.begin()));
    out.set_communicator(StrCat(a.communicator(), "@", group.front()));
    out.set_bytes(Fit(a.bytes(), b.bytes()));
    return out;
  }

  proto::TraceMessage Message(const proto::TraceMessage& a, const proto::TraceMessage& b,
                              int r, const Site& at) const {
    const Mesh &m = s_.mesh, &n = o_.mesh;
    NEURON_CHECK(m.Tensor(a.peer()) == m.Tensor(at.x.rank()), In(true, at),
                 ": a message between tensor positions (ranks ", at.x.rank(), " and ",
                 a.peer(), ")");
    NEURON_CHECK(n.Tensor(b.peer()) == n.Tensor(at.y.rank()), In(false, at),
                 ": a message between tensor positions (ranks ", at.y.rank(), " and ",
                 b.peer(), ")");
    NEURON_CHECK(a.send() == b.send() && a.tag() == b.tag() &&
                     m.Pipeline(a.peer()) == n.Pipeline(b.peer()) &&
                     m.Data(a.peer()) % n.dp == n.Data(b.peer()),
                 Differ(at), ": a message to or from rank ", a.peer(), " with tag ",
                 a.tag(), " against rank ", b.peer(), " with tag ", b.tag());
    proto::TraceMessage out = a;
    out.set_peer(to_.Rank(to_.Tensor(r), m.Pipeline(a.peer()), m.Data(a.peer())));
    out.set_bytes(Fit(a.bytes(), b.bytes()));
    return out;
  }

  Recording s_, o_;  // s_: the recording whose data-parallel layout is kept
  Mesh to_;
};

// An upper bound of the group members the scaled traces hold: the kept
// recording's, times the target ranks that read each of its traces, times
// how much a tensor-parallel group grows (both tp / its tp).
double MembersBound(const Recording& s, int tp) {
  double members = 0;
  for (const auto& t : *s.traces) {
    for (const auto& op : t.ops()) {
      for (const auto& c : op.issue().collectives()) members += c.group_size();
    }
  }
  const double growth = std::max(1.0, static_cast<double>(tp) / s.mesh.tp);
  return members * growth * growth;
}

}  // namespace

std::vector<proto::RankTrace> ScaleTensorParallel(const std::vector<proto::RankTrace>& a,
                                                  const std::vector<proto::RankTrace>& b,
                                                  int tp) {
  Recording s{&a, CheckJobTraces(a)}, o{&b, CheckJobTraces(b)};
  NEURON_CHECK(a[0].layout().ep() <= 1 && b[0].layout().ep() <= 1,
               "cannot scale tensor parallelism of an expert-parallel recording (ep ",
               std::max(a[0].layout().ep(), b[0].layout().ep()),
               "): its all-to-alls and experts do not follow Amdahl's law in tp");
  NEURON_CHECK(tp >= 1 && tp <= (1 << 16), "cannot scale to tp=", tp);
  NEURON_CHECK(s.mesh.tp != o.mesh.tp,
               "scaling tensor parallelism needs recordings at two "
               "different tp sizes (both are tp=",
               s.mesh.tp, ")");
  NEURON_CHECK(s.mesh.pp == o.mesh.pp, "the recordings differ in pp (", s.mesh.pp,
               " and ", o.mesh.pp, "): only tp may differ");
  NEURON_CHECK(tp >= std::min(s.mesh.tp, o.mesh.tp), "cannot scale to tp=", tp,
               ", below both recordings (tp=", s.mesh.tp, " and tp=", o.mesh.tp,
               "): a smaller tp holds more gradient bytes per rank, which a byte-capped "
               "bucketing may split into more collectives than either recording issued");
  if (o.mesh.dp > s.mesh.dp) std::swap(s, o);
  NEURON_CHECK(std::int64_t{tp} * s.mesh.pp * s.mesh.dp <= (1 << 20),
               "cannot scale to tp=", tp, ": the job would have more than 2^20 ranks");
  constexpr double kMaxMembers = 1 << 26;  // group members, 4 bytes each and more
  const double members = MembersBound(s, tp);
  NEURON_CHECK(members <= kMaxMembers, "cannot scale to tp=", tp,
               ": the traces would hold up to ", members,
               " group members (more than 2^26)");
  const Scaler scaler(s, o, tp);
  std::vector<proto::RankTrace> out;
  out.reserve(static_cast<std::size_t>(scaler.target().world()));
  for (int r = 0; r < scaler.target().world(); ++r) out.push_back(scaler.Rank(r));
  return out;
}

}  // namespace neuron::runtime
