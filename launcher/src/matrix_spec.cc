// LoadMatrix: parsing, defaults, validation with locations, expansion.
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "neuron/launcher/matrix.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/text_proto.h"
#include "neuron/runtime/topology.h"
#include "source_path.h"

namespace neuron::launcher {

namespace {

namespace fs = std::filesystem;
using google::protobuf::TextFormat;

// Where fields sit in the file, for messages: "FILE:LINE: field: ...".
class Locator {
 public:
  Locator(std::string path, const TextFormat::ParseInfoTree* tree)
      : path_(std::move(path)), tree_(tree) {}

  // `field` of the matrix, or of its repeated `parent` element `index`.
  std::string At(const std::string& field, const std::string& parent = "",
                 int index = -1) const {
    const auto* descriptor = proto::ScalingMatrix::descriptor();
    const TextFormat::ParseInfoTree* tree = tree_;
    std::string name = field;
    if (!parent.empty()) {
      tree = tree->GetTreeForNested(descriptor->FindFieldByName(parent), index);
      descriptor = descriptor->FindFieldByName(parent)->message_type();
      name = StrCat(parent, "[", index, "].", field);
    }
    int line = -1;
    if (tree != nullptr) {
      const auto* f = descriptor->FindFieldByName(field);
      if (f != nullptr) {
        line = tree->GetLocation(f, f->is_repeated() ? 0 : -1).line;
        if (line < 0 && !parent.empty()) {
          line = tree_->GetLocation(proto::ScalingMatrix::descriptor()->FindFieldByName(parent),
                                    index).line;
        }
      }
    }
    return line >= 0 ? StrCat(path_, ":", line + 1, ": ", name) : StrCat(path_, ": ", name);
  }

  // Whether the file sets scalar `field` (of element `index` of `parent`):
  // proto3 has no presence, so an explicit 0 is told from an absent field
  // by where the parser saw it.
  bool Written(const std::string& field, const std::string& parent = "",
               int index = -1) const {
    const auto* descriptor = proto::ScalingMatrix::descriptor();
    const TextFormat::ParseInfoTree* tree = tree_;
    if (!parent.empty()) {
      tree = tree->GetTreeForNested(descriptor->FindFieldByName(parent), index);
      descriptor = descriptor->FindFieldByName(parent)->message_type();
    }
    const auto* f = descriptor->FindFieldByName(field);
    return tree != nullptr && f != nullptr && tree->GetLocation(f, -1).line >= 0;
  }

 private:
  std::string path_;
  const TextFormat::ParseInfoTree* tree_;
};

// Bounds of the matrix's numbers: a cell past them could not run here, and
// products of them (world, tp x pp) stay far inside 64 bits.
constexpr std::int64_t kMaxNodes = 4096;         // neuronrun --nnodes
constexpr std::int64_t kMaxRanksPerNode = 65536;
constexpr std::int64_t kMaxWorld = 65536;        // nodes x ranks_per_node (modelled cells too)
constexpr std::int64_t kMaxParallel = 65536;     // tp, pp, microbatches, max_real_ranks
constexpr std::int64_t kMaxDim = 65536;
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxSeq = 1 << 20;
constexpr std::int64_t kMaxVocab = 1 << 24;
constexpr std::int64_t kMaxSteps = 1000000;
constexpr std::int64_t kMaxBatch = 1 << 20;

// Throws InvalidUsage naming `where` unless lo <= value <= hi.
void CheckRange(std::int64_t value, std::int64_t lo, std::int64_t hi, const std::string& where) {
  NEURON_CHECK(value >= lo && value <= hi, where, ": must be ", lo, " to ", hi, ", got ", value);
}

// A relative path from a matrix file (source_path.h).
fs::path Resolve(const std::string& name, const std::string& matrix_path) {
  return ResolveNear(name, matrix_path);
}

std::string Slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out.empty() ? "default" : out;
}

// Each modelled cell replays real cells like it (ReplaySources).
void ChooseSources(MatrixSpec& spec, const Locator& at) {
  for (MatrixCell& c : spec.cells) {
    if (!c.modelled) continue;
    std::tie(c.source, c.tp_source) = ReplaySources(spec, c);
    const int ep = c.strategy.ep();
    NEURON_CHECK(
        c.source >= 0 || ep == 1, at.At("max_real_ranks"), ": cell ", c.id, " (", c.world(),
        " ranks, ep ", ep, ") is modelled, but no real cell of strategy ", c.strategy.name(),
        ", model ", c.model.name(), " and ", c.batch_per_dp,
        " sequences per data-parallel rank has 2 replicas of its ep x tp = ",
        ep * c.strategy.tp(), " ranks to record (", 2 * ep * c.strategy.tp() * c.strategy.pp(),
        " ranks or more): a replay adds replicas of a recorded ep, it does not model a "
        "larger ep (the all-to-all's peers and each expert's tokens change with it; add "
        "such a ranks_per_node or raise max_real_ranks)");
    NEURON_CHECK(
        c.source >= 0, at.At("max_real_ranks"), ": cell ", c.id, " (", c.world(),
        " ranks) is modelled, but no real cell of strategy ", c.strategy.name(),
        ", model ", c.model.name(), " and ", c.batch_per_dp,
        " sequences per data-parallel rank has at least 2 data-parallel ranks to "
        "record, nor are there real cells at two other tp sizes (>= 2) of a strategy "
        "that differs only in tp, nor one at a smaller pp (>= 2, without ZeRO or "
        "sequence "
        "parallelism) of a "
        "strategy that differs only in pp (add such a ranks_per_node or strategy, "
        "or raise max_real_ranks)");
  }
}

}  // namespace

namespace {

// Whether real cell `d` recorded a run `cell` can be replayed from: the same
// model, compile mode and per-rank batch (strategy and size are the
// callers').
bool RecordsLike(const MatrixCell& d, const MatrixCell& cell) {
  return !d.modelled && d.model.name() == cell.model.name() &&
         d.compile == cell.compile && d.batch_per_dp == cell.batch_per_dp &&
         d.strategy.ep() == cell.strategy.ep();
}

}  // namespace

int RecordingFor(const MatrixSpec& spec, const MatrixCell& cell, int below) {
  int best = -1;
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& d = spec.cells[i];
    if (!RecordsLike(d, cell) || d.world() >= below || d.replicas() < 2 ||
        d.strategy.name() != cell.strategy.name()) {
      continue;
    }
    const bool same_topology = d.topology == cell.topology;
    if (best < 0) {
      best = static_cast<int>(i);
      continue;
    }
    const MatrixCell& b = spec.cells[static_cast<std::size_t>(best)];
    if (std::make_pair(same_topology, d.world()) >
        std::make_pair(b.topology == cell.topology, b.world())) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

namespace {

// Whether two strategies differ at most in name and the sizes not kept.
bool SameBut(const proto::Strategy& a, const proto::Strategy& b, bool keep_tp,
             bool keep_pp) {
  return (!keep_tp || a.tp() == b.tp()) && (!keep_pp || a.pp() == b.pp()) &&
         a.zero() == b.zero() && a.microbatches() == b.microbatches() && a.sp() == b.sp();
}

}  // namespace

std::pair<int, int> TpRecordingsFor(const MatrixSpec& spec, const MatrixCell& cell,
                                    int up_to) {
  if (cell.strategy.ep() > 1) return {-1, -1};  // ScaleTensorParallel refuses ep traces
  std::map<int, std::vector<int>> by_tp;  // candidates per tp
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& d = spec.cells[i];
    if (!RecordsLike(d, cell) || &d == &cell || d.world() > up_to ||
        d.strategy.tp() < 2 || !SameBut(d.strategy, cell.strategy, false, true)) {
      continue;
    }
    by_tp[d.strategy.tp()].push_back(static_cast<int>(i));
  }
  // The first: at the cell's own tp, else the largest below it; the second:
  // at the largest other tp, the same dp as the first's preferred.
  auto first_tp = by_tp.upper_bound(cell.strategy.tp());
  if (first_tp == by_tp.begin() || by_tp.size() < 2) return {-1, -1};
  --first_tp;
  auto second_tp = std::prev(by_tp.end());
  if (second_tp == first_tp) --second_tp;
  auto best = [&](const std::vector<int>& cells, int same_dp) {
    auto key = [&](int i) {
      const MatrixCell& x = spec.cells[static_cast<std::size_t>(i)];
      return std::make_tuple(x.dp() == same_dp, x.dp() >= 2, x.topology == cell.topology,
                             x.world());
    };
    return *std::max_element(cells.begin(), cells.end(),
                             [&](int a, int b) { return key(a) < key(b); });
  };
  const int first = best(first_tp->second, -1);
  return {first,
          best(second_tp->second, spec.cells[static_cast<std::size_t>(first)].dp())};
}

int PpRecordingFor(const MatrixSpec& spec, const MatrixCell& cell, int up_to) {
  if (cell.strategy.ep() > 1) return -1;  // ScalePipeline refuses ep traces
  int best = -1;
  auto key = [&](int i) {
    const MatrixCell& x = spec.cells[static_cast<std::size_t>(i)];
    return std::make_tuple(x.dp() >= 2, x.topology == cell.topology, x.strategy.pp(),
                           x.world());
  };
  for (std::size_t i = 0; i < spec.cells.size(); ++i) {
    const MatrixCell& d = spec.cells[i];
    if (!RecordsLike(d, cell) || &d == &cell || d.world() > up_to ||
        d.strategy.pp() < 2 || d.strategy.pp() >= cell.strategy.pp() ||
        d.strategy.zero() != 0 || d.strategy.sp() ||
        !SameBut(d.strategy, cell.strategy, true, false)) {
      continue;
    }
    if (best < 0 || key(best) < key(static_cast<int>(i))) best = static_cast<int>(i);
  }
  return best;
}

std::pair<int, int> ReplaySources(const MatrixSpec& spec, const MatrixCell& cell) {
  const int own = RecordingFor(spec, cell, cell.world());
  if (own >= 0) return {own, -1};
  const auto tp = TpRecordingsFor(spec, cell, cell.world());
  if (tp.first >= 0) return tp;
  return {PpRecordingFor(spec, cell, cell.world()), -1};
}

namespace {

// Fills the matrix's scalar defaults and checks them (the trainer script
// resolved into spec.script).
void CheckScalars(const std::string& path, const Locator& at, MatrixSpec& spec) {
  proto::ScalingMatrix& m = spec.matrix;
  if (m.script().empty()) m.set_script("examples/04_train_gpt.py");
  const fs::path script = Resolve(m.script(), path);
  NEURON_CHECK(fs::exists(script), at.At("script"), ": no trainer ", m.script(),
               " (next to the matrix, in the current directory or in ", NEURON_SOURCE_DIR, ")");
  spec.script = script.string();
  if (!at.Written("steps")) m.set_steps(3);
  NEURON_CHECK(m.steps() >= 2, at.At("steps"), ": needs at least 2 steps (the first one "
               "compiles and warms up), got ", m.steps());
  CheckRange(m.steps(), 2, kMaxSteps, at.At("steps"));
  if (!at.Written("batch")) m.set_batch(8);
  CheckRange(m.batch(), 1, kMaxBatch, at.At("batch"));
  if (!at.Written("max_real_ranks")) m.set_max_real_ranks(16);
  CheckRange(m.max_real_ranks(), 1, kMaxParallel, at.At("max_real_ranks"));
  if (m.nodes().empty()) m.add_nodes(1);
  if (m.compile().empty()) m.add_compile(false);
  if (m.topologies().empty()) m.add_topologies("");
  NEURON_CHECK(!m.ranks_per_node().empty(), path, ": ranks_per_node: at least one value needed");
  NEURON_CHECK(!m.strategies().empty(), path, ": strategies: at least one needed");
  NEURON_CHECK(!m.models().empty(), path, ": models: at least one needed");
  for (int i = 0; i < m.nodes_size(); ++i) CheckRange(m.nodes(i), 1, kMaxNodes, at.At("nodes"));
  for (int i = 0; i < m.ranks_per_node_size(); ++i) {
    CheckRange(m.ranks_per_node(i), 1, kMaxRanksPerNode, at.At("ranks_per_node"));
  }
}

// Fills each strategy's defaults (for fields the file leaves out; a written
// 0 is an error) and name, and checks it.
void CheckStrategies(const Locator& at, proto::ScalingMatrix& m) {
  for (int s = 0; s < m.strategies_size(); ++s) {
    proto::Strategy& st = *m.mutable_strategies(s);
    if (!at.Written("tp", "strategies", s)) st.set_tp(1);
    if (!at.Written("pp", "strategies", s)) st.set_pp(1);
    if (!at.Written("microbatches", "strategies", s)) st.set_microbatches(4);
    if (!at.Written("ep", "strategies", s)) st.set_ep(1);
    if (st.name().empty()) {
      st.set_name(StrCat("tp", st.tp(), "-pp", st.pp(), "-z", st.zero(),
                         st.ep() > 1 ? StrCat("-ep", st.ep()) : ""));
    }
    CheckRange(st.ep(), 1, kMaxParallel, at.At("ep", "strategies", s));
    CheckRange(st.tp(), 1, kMaxParallel, at.At("tp", "strategies", s));
    CheckRange(st.pp(), 1, kMaxParallel, at.At("pp", "strategies", s));
    CheckRange(st.microbatches(), 1, kMaxParallel, at.At("microbatches", "strategies", s));
    NEURON_CHECK(st.zero() >= 0 && st.zero() <= 3, at.At("zero", "strategies", s),
                 ": ZeRO stage must be 0-3, got ", st.zero());
    NEURON_CHECK(!st.sp() || st.tp() > 1, at.At("sp", "strategies", s),
                 ": sequence parallelism needs tp > 1");
  }
}

// Fills each model's defaults and name, and checks it.
void CheckModels(const Locator& at, proto::ScalingMatrix& m) {
  for (int k = 0; k < m.models_size(); ++k) {
    proto::Model& md = *m.mutable_models(k);
    if (!at.Written("seq", "models", k)) md.set_seq(32);
    if (!at.Written("vocab", "models", k)) md.set_vocab(256);
    if (!at.Written("heads", "models", k)) md.set_heads(4);
    if (md.name().empty()) md.set_name(StrCat("d", md.dim(), "-l", md.layers()));
    CheckRange(md.dim(), 1, kMaxDim, at.At("dim", "models", k));
    CheckRange(md.layers(), 1, kMaxLayers, at.At("layers", "models", k));
    CheckRange(md.heads(), 1, md.dim(), at.At("heads", "models", k));
    CheckRange(md.seq(), 1, kMaxSeq, at.At("seq", "models", k));
    CheckRange(md.vocab(), 1, kMaxVocab, at.At("vocab", "models", k));
    NEURON_CHECK(md.dim() % md.heads() == 0, at.At("heads", "models", k), ": ",
                 md.heads(), " heads do not divide dim ", md.dim());
    NEURON_CHECK(md.experts() >= 0 && md.experts() <= 4096, at.At("experts", "models", k),
                 ": must be 0 (a dense model) to 4096, got ", md.experts());
    if (md.experts() == 0) {
      NEURON_CHECK(!at.Written("top_k", "models", k), at.At("top_k", "models", k),
                   ": top_k is a Mixture of Experts' (set experts too)");
      continue;
    }
    if (!at.Written("top_k", "models", k)) md.set_top_k(std::min(2, md.experts()));
    CheckRange(md.top_k(), 1, md.experts(), at.At("top_k", "models", k));
  }
}

// Resolves each topology file (next to the matrix, here or in the sources).
void ResolveTopologies(const std::string& path, const Locator& at, proto::ScalingMatrix& m) {
  for (int t = 0; t < m.topologies_size(); ++t) {
    if (m.topologies(t).empty()) continue;
    const fs::path file = Resolve(m.topologies(t), path);
    NEURON_CHECK(fs::exists(file), at.At("topologies"), ": no topology file ",
                 m.topologies(t), " (next to the matrix, in the current directory or in ",
                 NEURON_SOURCE_DIR, ")");
    m.set_topologies(t, file.string());
  }
}

// Whether strategy `st` (strategies[s]) can lay out model `md` (models[k])
// on `dp` data-parallel ranks (of `ranks`, as messages name them).
void CheckCellLayout(const Locator& at, int s, const proto::Strategy& st, int k,
                     const proto::Model& md, std::int64_t dp, const std::string& ranks) {
  NEURON_CHECK(md.heads() % st.tp() == 0, at.At("heads", "models", k), ": ", md.heads(),
               " heads are not divisible by strategy ", st.name(), "'s tp ", st.tp());
  NEURON_CHECK(md.layers() + 2 >= st.pp(), at.At("layers", "models", k),
               ": too few layers for strategy ", st.name(), "'s ", st.pp(),
               " pipeline stages");
  NEURON_CHECK(!st.sp() || md.seq() % st.tp() == 0, at.At("seq", "models", k),
               ": sequence ", md.seq(), " not divisible by tp ", st.tp());
  if (st.ep() == 1) return;
  NEURON_CHECK(md.experts() > 0, at.At("ep", "strategies", s), ": expert parallelism (ep ",
               st.ep(), ") needs a model with experts; model ", md.name(), " has none");
  NEURON_CHECK(md.experts() % st.ep() == 0, at.At("experts", "models", k), ": ",
               md.experts(), " experts are not divisible by strategy ", st.name(), "'s ep ",
               st.ep());
  NEURON_CHECK(dp % st.ep() == 0, at.At("ep", "strategies", s), ": ep ", st.ep(),
               " does not divide the ", dp, " data-parallel ranks of ", ranks,
               " / (tp ", st.tp(), " x pp ", st.pp(), ")");
}

// The cells of `n` nodes x `r` ranks per node with strategy `s`: one per
// model, compile flag and topology, each checked as a layout.
void AddCells(int n, int r, int s, const Locator& at, MatrixSpec& spec) {
  const proto::ScalingMatrix& m = spec.matrix;
  const proto::Strategy& st = m.strategies(s);
  // Within the bounds the checks above set: no product overflows.
  const std::int64_t world = std::int64_t{n} * r;
  NEURON_CHECK(world <= kMaxWorld, at.At("ranks_per_node"), ": ", n, " nodes x ", r,
               " ranks per node = ", world, " ranks, more than the ", kMaxWorld,
               " a matrix cell may have");
  const std::int64_t model_parallel = std::int64_t{st.tp()} * st.pp();
  NEURON_CHECK(world % model_parallel == 0, at.At("tp", "strategies", s),
               ": tp x pp = ", st.tp(), " x ", st.pp(), " does not divide ", world,
               " ranks (", n, " nodes x ", r, " ranks per node)");
  const std::int64_t dp = world / model_parallel;
  for (int k = 0; k < m.models_size(); ++k) {
    const proto::Model& md = m.models(k);
    CheckCellLayout(at, s, st, k, md, dp, StrCat(world, " ranks (", n, " nodes x ", r,
                                                  " ranks per node)"));
    int per_dp = m.batch();
    if (m.scaling() == proto::STRONG) {
      NEURON_CHECK(m.batch() % dp == 0, at.At("batch"), ": strong scaling's global "
                   "batch ", m.batch(), " is not divisible by ", dp,
                   " data-parallel ranks (strategy ", st.name(), ", ", world, " ranks)");
      per_dp = m.batch() / dp;
    }
    for (bool compile : m.compile()) {
      for (const std::string& topology : m.topologies()) {
        MatrixCell cell;
        cell.nodes = n;
        cell.ranks_per_node = r;
        cell.strategy = st;
        cell.model = md;
        cell.compile = compile;
        cell.topology = topology;
        cell.batch_per_dp = per_dp;
        cell.modelled = world > m.max_real_ranks();
        cell.id = StrCat("n", n, "x", r, "-", Slug(st.name()), "-", Slug(md.name()), "-",
                         compile ? "compiled" : "eager", "-",
                         topology.empty() ? "default"
                                          : Slug(fs::path(topology).stem().string()));
        spec.cells.push_back(std::move(cell));
      }
    }
  }
}

// Every combination; each topology read once and checked to fit each node
// shape once.
void ExpandCells(const Locator& at, MatrixSpec& spec) {
  const proto::ScalingMatrix& m = spec.matrix;
  std::vector<runtime::Topology> topologies;
  for (const std::string& topology : m.topologies()) {
    if (!topology.empty()) topologies.push_back(runtime::Topology::FromFile(topology));
  }
  for (int n : m.nodes()) {
    for (int r : m.ranks_per_node()) {
      for (const auto& topology : topologies) {
        topology.CheckFits(n, {static_cast<std::uint32_t>(r)});
      }
      for (int s = 0; s < m.strategies_size(); ++s) AddCells(n, r, s, at, spec);
    }
  }
}

}  // namespace

MatrixSpec LoadMatrix(const std::string& path) {
  MatrixSpec spec;
  spec.path = path;
  const std::string text = runtime::ReadTextFile(path, "scaling matrix");
  TextFormat::ParseInfoTree tree;
  // Syntax errors (unknown fields included) name the line; `tree` keeps
  // every field's for the checks below.
  runtime::ParseTextProto(text, path, "scaling matrix", &spec.matrix, &tree);
  const Locator at(path, &tree);
  CheckScalars(path, at, spec);
  CheckStrategies(at, spec.matrix);
  CheckModels(at, spec.matrix);
  ResolveTopologies(path, at, spec.matrix);
  ExpandCells(at, spec);
  ChooseSources(spec, at);
  return spec;
}

}  // namespace neuron::launcher
