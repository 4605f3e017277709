#include "neuron/runtime/fabric/trace_replay.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>
#include <regex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/trace_job.h"
#include "neuron/runtime/op_trace.h"

namespace neuron::runtime {

namespace {

// Maps the recorded job onto the replayed one (see the header).
class RankMap {
 public:
  RankMap(Mesh recorded, Mesh target) : from_(recorded), to_(target) {}

  bool identity() const { return from_.dp == to_.dp; }

  int Source(int target_rank) const {
    return from_.Rank(to_.Tensor(target_rank), to_.Pipeline(target_rank),
                      to_.Data(target_rank) % from_.dp);
  }

  // Whether recorded collective `c`'s group spans the data-parallel axis
  // (it then spans the whole new one); InvalidUsage when it spans part of
  // it. O(recorded group).
  bool Spans(const proto::TraceCollective& c) const {
    if (identity()) return false;  // members map to themselves either way
    std::set<std::pair<int, int>> positions;  // (tensor, pipeline)
    std::set<int> replicas;
    for (int g : c.group()) {
      positions.insert({from_.Tensor(g), from_.Pipeline(g)});
      replicas.insert(from_.Data(g));
    }
    const bool spans = replicas.size() > 1;
    NEURON_CHECK(positions.size() * replicas.size() == static_cast<std::size_t>(c.group_size()) &&
                     (!spans || static_cast<int>(replicas.size()) == from_.dp),
                 "cannot scale the ", c.kind(), " on communicator ", c.communicator(),
                 ": its group spans part of the data-parallel axis (", replicas.size(),
                 " of ", from_.dp, " replicas)");
    return spans;
  }

  // Recorded group member `g` as target rank `target_rank` sees it (a
  // spanning group's member keeps its replica, the others take the target's).
  int Member(int g, bool spans, int target_rank) const {
    if (identity()) return g;
    return to_.Rank(from_.Tensor(g), from_.Pipeline(g),
                    spans ? from_.Data(g) % to_.dp : to_.Data(target_rank));
  }

  // The lowest target member of `c`'s group (what names its match): every
  // member of every collective asks, so O(recorded group), not O(target).
  int First(const proto::TraceCollective& c, bool spans, int target_rank) const {
    int first = std::numeric_limits<int>::max();
    for (int g : c.group()) first = std::min(first, Member(g, spans, target_rank));
    return first;
  }

  // Every target member of `c`'s group, ascending: once per collective.
  std::vector<int> Group(const proto::TraceCollective& c, bool spans, int target_rank) const {
    std::vector<int> out;
    for (int g : c.group()) {
      if (!spans) {
        out.push_back(Member(g, spans, target_rank));
      } else if (from_.Data(g) == 0) {  // each position once: in every new replica
        for (int d = 0; d < to_.dp; ++d) {
          out.push_back(to_.Rank(from_.Tensor(g), from_.Pipeline(g), d));
        }
      }
    }
    if (!identity()) std::sort(out.begin(), out.end());
    return out;
  }

  int Peer(int recorded_peer, int target_rank) const {
    if (identity()) return recorded_peer;
    const int source = Source(target_rank);
    NEURON_CHECK(from_.Data(recorded_peer) == from_.Data(source), "cannot scale a message ",
                 "between data-parallel replicas (recorded ranks ", source, " and ",
                 recorded_peer, ")");
    return to_.Rank(from_.Tensor(recorded_peer), from_.Pipeline(recorded_peer),
                    to_.Data(target_rank));
  }

 private:
  Mesh from_, to_;
};

// An issued operation waiting on its lane.
struct Pending {
  std::size_t op = 0;    // index into the rank's ops
  double issued_us = 0;
  int part = 0;          // the next collective or message to run
  bool posted = false;   // the current collective part's arrival is posted ...
  std::string match;     // ... to this match
  double end_us = 0;     // messages: the latest receive so far
};

struct Match {
  std::vector<int> group;
  std::string kind;
  double bytes = 0;
  int root = 0;  // the root's target rank
  int posted = 0;
  double start_us = 0;
  std::optional<double> end_us;
};

struct RankState {
  const proto::RankTrace* trace = nullptr;
  std::size_t cursor = 0;
  bool issue_queued = false;  // the op at `cursor` is an issue already on its lane
  double compute_us = 0;      // the compute stream
  // Per communicator: its issues in order, on its collectives or messages
  // lane, and (collectives) when its stream is next free.
  std::map<std::string, std::deque<Pending>> collectives, messages;
  std::map<std::string, double> stream_end_us;
  std::vector<std::optional<double>> issue_end;
  std::vector<ReplayedStep> steps;  // per step: the clock's advance, compute, waits
  bool in_step = false;
  ReplayedStep current;
};

class Replayer {
 public:
  Replayer(const std::vector<proto::RankTrace>& traces, const FabricModel& target, Mesh from,
           Mesh to)
      : target_(target),
        algorithm_(ConfiguredFabricAlgorithm()),
        map_(from, to),
        ranks_(target.world_size()) {
    for (int r = 0; r < target.world_size(); ++r) {
      RankState& s = ranks_[static_cast<std::size_t>(r)];
      s.trace = &traces[static_cast<std::size_t>(map_.Source(r))];
      s.issue_end.resize(static_cast<std::size_t>(s.trace->ops_size()));
    }
  }

  void Run() {
    while (true) {
      bool progressed = false, done = true;
      for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
        progressed |= AdvanceCompute(r);
        progressed |= AdvanceCollectives(r);
        progressed |= AdvanceMessages(r);
        const RankState& s = ranks_[static_cast<std::size_t>(r)];
        done = done && s.cursor == static_cast<std::size_t>(s.trace->ops_size()) &&
               Drained(s.collectives) && Drained(s.messages);
      }
      if (done) return;
      if (!progressed) ThrowDeadlock();
    }
  }

  std::vector<ReplayedStep> Steps() const {
    std::size_t n = ranks_[0].steps.size();
    for (const auto& s : ranks_) {
      NEURON_CHECK(s.steps.size() == n, "the traces mark different numbers of steps (",
                   n, " and ", s.steps.size(), ")");
    }
    std::vector<ReplayedStep> steps(n);
    for (std::size_t k = 0; k < n; ++k) {
      for (const auto& s : ranks_) {
        if (s.steps[k].modelled_us >= steps[k].modelled_us) steps[k] = s.steps[k];
      }
      steps[k].rank0_bytes = ranks_[0].steps[k].rank0_bytes;
    }
    return steps;
  }

 private:
  bool AdvanceCompute(int r) {
    RankState& s = ranks_[static_cast<std::size_t>(r)];
    bool progressed = false;
    while (s.cursor < static_cast<std::size_t>(s.trace->ops_size())) {
      const proto::TraceOp& op = s.trace->ops(static_cast<int>(s.cursor));
      if (op.has_compute()) {
        s.compute_us += op.compute().us();
        s.current.compute_us += op.compute().us();
      } else if (op.has_mark()) {
        Mark(s, op.mark().name());
      } else if (op.has_issue()) {
        if (!s.issue_queued) {
          const proto::TraceIssue& issue = op.issue();
          Pending p;
          p.op = s.cursor;
          p.issued_us = s.compute_us;
          if (issue.collectives_size() > 0) {
            s.collectives[issue.collectives(0).communicator()].push_back(p);
          } else if (issue.messages_size() > 0) {
            s.messages[issue.messages(0).communicator()].push_back(p);
          } else {
            s.issue_end[s.cursor] = s.compute_us;  // it did nothing
          }
          CountBytes(r, s, issue);
          s.issue_queued = true;
          progressed = true;
        }
        if (op.issue().waited_at_issue() && !Join(s, s.cursor)) return progressed;
        s.issue_queued = false;
      } else if (op.has_wait()) {
        NEURON_CHECK(op.wait().issue() < s.cursor &&
                         s.trace->ops(static_cast<int>(op.wait().issue())).has_issue(),
                     "trace of rank ", s.trace->rank(), ": op ", s.cursor,
                     " waits for op ", op.wait().issue(), ", which is no earlier issue");
        if (!Join(s, static_cast<std::size_t>(op.wait().issue()))) return progressed;
      }
      ++s.cursor;
      progressed = true;
    }
    return progressed;
  }

  // The compute stream waits for issue `i`; false while its end is unknown.
  static bool Join(RankState& s, std::size_t i) {
    if (!s.issue_end[i]) return false;
    const double waited = std::max(0.0, *s.issue_end[i] - s.compute_us);
    const bool messages = s.trace->ops(static_cast<int>(i)).issue().messages_lane();
    (messages ? s.current.message_wait_us : s.current.collective_wait_us) += waited;
    s.compute_us += waited;
    return true;
  }

  void Mark(RankState& s, const std::string& name) {
    if (name == "step_begin") {
      s.in_step = true;
      s.current = {};
      s.current.modelled_us = -s.compute_us;
    } else if (name == "step_end" && s.in_step) {
      s.in_step = false;
      s.current.modelled_us += s.compute_us;
      s.steps.push_back(s.current);
    }
  }

  void CountBytes(int r, RankState& s, const proto::TraceIssue& issue) {
    if (r != 0 || !s.in_step) return;
    for (const auto& c : issue.collectives()) s.current.rank0_bytes[c.kind()] += c.bytes();
  }

  static bool Drained(const std::map<std::string, std::deque<Pending>>& lanes) {
    for (const auto& [name, lane] : lanes) {
      if (!lane.empty()) return false;
    }
    return true;
  }

  bool AdvanceCollectives(int r) {
    bool progressed = false;
    for (auto& [name, lane] : ranks_[static_cast<std::size_t>(r)].collectives) {
      progressed |= AdvanceCollectiveLane(r, lane, name);
    }
    return progressed;
  }

  // One communicator's collectives, in issue order.
  bool AdvanceCollectiveLane(int r, std::deque<Pending>& lane, const std::string& name) {
    RankState& s = ranks_[static_cast<std::size_t>(r)];
    double& stream_end = s.stream_end_us[name];
    bool progressed = false;
    while (!lane.empty()) {
      Pending& p = lane.front();
      const proto::TraceIssue& issue = s.trace->ops(static_cast<int>(p.op)).issue();
      if (p.part == issue.collectives_size()) {
        s.issue_end[p.op] = stream_end;
        lane.pop_front();
        progressed = true;
        continue;
      }
      if (!p.posted) {
        const proto::TraceCollective& c = issue.collectives(p.part);
        const bool spans = map_.Spans(c);
        const int root = map_.Member(c.group(c.root()), spans, r);
        p.match = StrCat(c.communicator(), "@", map_.First(c, spans, r), "#", c.sequence());
        Match& m = matches_[p.match];
        if (m.posted == 0) {
          m.group = map_.Group(c, spans, r);
          m.kind = c.kind();
          m.root = root;
        }
        NEURON_CHECK(m.kind == c.kind() && m.root == root, "rank ", r, " replays ", c.kind(),
                     " #", c.sequence(), " on communicator ", c.communicator(),
                     " but a peer recorded ", m.kind, " there");
        const double arrival = std::max(p.issued_us, stream_end) +
                               target_.topology().RankDelay(r).count();
        m.start_us = std::max(m.start_us, arrival);
        m.bytes = std::max(m.bytes, c.bytes());
        p.posted = true;
        progressed = true;
        if (++m.posted == static_cast<int>(m.group.size())) m.end_us = m.start_us + Cost(m);
      }
      Match& m = matches_[p.match];
      if (!m.end_us) return progressed;
      stream_end = std::max(stream_end, *m.end_us);
      if (++m.posted == 2 * static_cast<int>(m.group.size())) matches_.erase(p.match);
      ++p.part;
      p.posted = false;
      progressed = true;
    }
    return progressed;
  }

  bool AdvanceMessages(int r) {
    bool progressed = false;
    for (auto& [name, lane] : ranks_[static_cast<std::size_t>(r)].messages) {
      progressed |= AdvanceMessageLane(r, lane);
    }
    return progressed;
  }

  // One communicator's messages, in issue order.
  bool AdvanceMessageLane(int r, std::deque<Pending>& lane) {
    RankState& s = ranks_[static_cast<std::size_t>(r)];
    bool progressed = false;
    while (!lane.empty()) {
      Pending& p = lane.front();
      const proto::TraceIssue& issue = s.trace->ops(static_cast<int>(p.op)).issue();
      if (p.part == issue.messages_size()) {
        s.issue_end[p.op] = std::max(p.issued_us, p.end_us);
        lane.pop_front();
        progressed = true;
        continue;
      }
      const proto::TraceMessage& m = issue.messages(p.part);
      const int peer = map_.Peer(m.peer(), r);
      if (m.send()) {
        channels_[{m.communicator(), r, peer, m.tag()}].push_back({p.issued_us, m.bytes()});
      } else {
        auto& channel = channels_[{m.communicator(), peer, r, m.tag()}];
        if (channel.empty()) return progressed;
        const auto [sent_us, bytes] = channel.front();
        channel.pop_front();
        p.end_us = std::max({p.end_us, p.issued_us, sent_us + Transfer(peer, r, bytes)});
      }
      ++p.part;
      progressed = true;
    }
    return progressed;
  }

  double Cost(const Match& m) {
    auto key = std::make_tuple(m.kind, m.bytes, m.group, m.root);
    auto it = costs_.find(key);
    if (it == costs_.end()) {
      const int root = static_cast<int>(std::find(m.group.begin(), m.group.end(), m.root) -
                                        m.group.begin());
      const double us =
          ModelCollective(target_, m.kind, m.bytes, m.group, root, algorithm_).micros;
      it = costs_.emplace(key, us).first;
    }
    return it->second;
  }

  double Transfer(int src, int dst, double bytes) {
    auto key = std::make_tuple(src, dst, bytes);
    auto it = transfers_.find(key);
    if (it == transfers_.end()) {
      const Schedule s = PointToPointSchedule(src, dst, bytes);
      it = transfers_.emplace(key, target_.Simulate(s).total.count()).first;
    }
    return it->second;
  }

  [[noreturn]] void ThrowDeadlock() const {
    std::string blocked;
    int listed = 0;
    for (int r = 0; r < static_cast<int>(ranks_.size()) && listed < 4; ++r) {
      const RankState& s = ranks_[static_cast<std::size_t>(r)];
      std::string what;
      for (const auto& [name, lane] : s.collectives) {
        if (lane.empty() || !what.empty()) continue;
        const auto& c =
            s.trace->ops(static_cast<int>(lane.front().op)).issue().collectives(lane.front().part);
        what = StrCat(c.kind(), " #", c.sequence(), " on communicator ", c.communicator());
      }
      for (const auto& [name, lane] : s.messages) {
        if (lane.empty() || !what.empty()) continue;
        const auto& m =
            s.trace->ops(static_cast<int>(lane.front().op)).issue().messages(lane.front().part);
        what = StrCat("a message from rank ", map_.Peer(m.peer(), r), " (tag ", m.tag(), ")");
      }
      if (what.empty() && s.cursor < static_cast<std::size_t>(s.trace->ops_size())) {
        what = StrCat("op ", s.cursor, " of its trace");
      }
      if (what.empty()) continue;
      blocked += StrCat(listed++ ? "; " : "", "rank ", r, " waits for ", what);
    }
    throw InvalidUsage(StrCat("the traces deadlock in replay: ", blocked));
  }

  const FabricModel& target_;
  const FabricAlgorithm algorithm_;  // NEURON_FABRIC_ALGO
  RankMap map_;
  std::vector<RankState> ranks_;
  std::unordered_map<std::string, Match> matches_;
  // (communicator, src, dst, tag) -> (send issue time, bytes), in send order
  std::map<std::tuple<std::string, int, int, std::uint64_t>,
           std::deque<std::pair<double, double>>>
      channels_;
  std::map<std::tuple<std::string, double, std::vector<int>, int>, double> costs_;
  std::map<std::tuple<int, int, double>, double> transfers_;
};

const char* FileKind(const std::filesystem::file_status& status) {
  namespace fs = std::filesystem;
  switch (status.type()) {
    case fs::file_type::regular: return "a regular file";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    default: return "not a directory";
  }
}

}  // namespace

ReplayResult ReplayTraces(const std::vector<proto::RankTrace>& traces,
                          const FabricModel& target) {
  const Mesh from = CheckJobTraces(traces);
  const int world = target.world_size();
  NEURON_CHECK(world % (from.tp * from.pp) == 0, "cannot replay tp=", from.tp, " x pp=",
               from.pp, " on ", world, " ranks: tp x pp must divide them");
  const Mesh to{from.tp, from.pp, world / (from.tp * from.pp)};
  NEURON_CHECK(to.dp == from.dp || from.dp >= 2, "scaling data parallelism from ", from.dp,
               " to ", to.dp, " replicas needs a trace of at least 2 replicas (the groups "
               "that span them must be told from those that do not)");
  Replayer replayer(traces, target, from, to);
  replayer.Run();
  ReplayResult result;
  result.world_size = world;
  result.tp = to.tp;
  result.pp = to.pp;
  result.dp = to.dp;
  result.ep = std::max(traces[0].layout().ep(), 1);
  result.recorded_world_size = static_cast<int>(traces.size());
  result.steps = replayer.Steps();
  return result;
}

std::vector<proto::RankTrace> LoadJobTraces(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);  // through links, as the open is
  NEURON_CHECK(fs::exists(status), "trace directory ", dir, " does not exist");
  NEURON_CHECK(fs::is_directory(status), "trace directory ", dir, " is not a directory (",
               FileKind(status), fs::is_symlink(fs::symlink_status(dir, error))
                   ? ", through a symbolic link)" : ")");
  std::map<int, std::string> files;
  const std::regex name(R"(rank_(\d+)\.pb)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string base = entry.path().filename().string();
    if (std::regex_match(base, m, name)) files[std::stoi(m[1])] = entry.path().string();
  }
  NEURON_CHECK(!files.empty(), "no rank_N.pb traces in ", dir);
  std::vector<proto::RankTrace> traces;
  for (const auto& [rank, path] : files) traces.push_back(LoadRankTrace(path));
  return traces;
}

}  // namespace neuron::runtime
