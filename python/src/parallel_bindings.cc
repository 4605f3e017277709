// torchneuron._C's parallel part: thin bindings of neuron::parallel for
// torchneuron.parallel (the Python face). Process groups arrive as torch's
// own Python objects (any backend).
#include "parallel_bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/checkpoint_io.h"
#include "neuron/parallel/distributed_sampler.h"
#include "neuron/parallel/gradient_reducer.h"
#include "neuron/parallel/mesh_layout.h"
#include "neuron/parallel/pipeline_engine.h"
#include "neuron/parallel/pipeline_p2p.h"
#include "neuron/parallel/pipeline_schedule.h"
#include "neuron/parallel/sharded_unit.h"
#include "neuron/parallel/tensor_parallel_ops.h"
#include "neuron/parallel/token_data.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;
namespace np = neuron::parallel;

namespace {

c10::intrusive_ptr<::c10d::ProcessGroup> Owned(::c10d::ProcessGroup& group) {
  return c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&group);
}

np::Axis ParseAxis(const std::string& axis) {
  if (axis == "tensor") return np::Axis::kTensor;
  if (axis == "data") return np::Axis::kData;
  if (axis == "pipeline") return np::Axis::kPipeline;
  throw neuron::InvalidUsage("parallel layout: axis must be tensor, data or pipeline, got '" +
                             axis + "'");
}

// torch dtypes arrive by name (str(torch.bfloat16) without "torch.").
at::ScalarType ParseFloatType(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw neuron::InvalidUsage("sharding: a compute or reduce dtype must be float32, bfloat16 or "
                             "float16, got '" + name + "'");
}

np::SamplerOptions Sampler(std::int64_t size, int replicas, int rank, bool shuffle,
                           std::uint64_t seed, bool drop_last) {
  return {size, replicas, rank, shuffle, seed, drop_last};
}

using PieceTuple = std::tuple<std::string, std::vector<std::int64_t>, int, std::int64_t, at::Tensor>;
using FileTuple = std::tuple<std::string, std::uint64_t, std::uint64_t>;

np::proto::ManifestFile ToFile(const FileTuple& f) {
  np::proto::ManifestFile out;
  out.set_name(std::get<0>(f));
  out.set_bytes(std::get<1>(f));
  out.set_checksum(std::get<2>(f));
  return out;
}

// Sends in flight (their works), waited for before the tensors may change.
struct PendingSends {
  std::vector<c10::intrusive_ptr<::c10d::Work>> works;
  void Wait() {
    for (auto& w : works) w->wait();
    works.clear();
  }
};

}  // namespace

void BindParallel(py::module_& m) {
  py::class_<np::MeshLayout>(m, "_MeshLayout")
      .def(py::init([](int world, int tp, int pp, int dp) {
             return np::MeshLayout::Create(world, {tp, pp, dp});
           }),
           py::arg("world"), py::arg("tp"), py::arg("pp"), py::arg("dp"))
      .def("size", [](const np::MeshLayout& l, const std::string& axis) {
        return l.size(ParseAxis(axis));
      })
      .def("coordinates",
           [](const np::MeshLayout& l, int rank) {
             const np::MeshCoordinates c = l.Coordinates(rank);
             return py::make_tuple(c.tp, c.dp, c.pp);
           })
      .def("rank", [](const np::MeshLayout& l, int tp, int dp,
                      int pp) { return l.Rank({tp, dp, pp}); })
      .def("group", [](const np::MeshLayout& l, const std::string& axis,
                       int rank) { return l.Group(ParseAxis(axis), rank); })
      .def("groups", [](const np::MeshLayout& l,
                        const std::string& axis) { return l.Groups(ParseAxis(axis)); })
      .def("describe", &np::MeshLayout::Describe);

  m.def(
      "_samples_per_rank",
      [](std::int64_t size, int replicas, int rank, bool shuffle, std::uint64_t seed,
         bool drop_last) {
        return np::SamplesPerRank(Sampler(size, replicas, rank, shuffle, seed, drop_last));
      },
      py::arg("size"), py::arg("replicas"), py::arg("rank"), py::arg("shuffle"),
      py::arg("seed"), py::arg("drop_last"));
  m.def(
      "_shard_indices",
      [](std::int64_t size, int replicas, int rank, bool shuffle, std::uint64_t seed,
         bool drop_last, std::uint64_t epoch) {
        return np::ShardIndices(Sampler(size, replicas, rank, shuffle, seed, drop_last), epoch);
      },
      py::arg("size"), py::arg("replicas"), py::arg("rank"), py::arg("shuffle"),
      py::arg("seed"), py::arg("drop_last"), py::arg("epoch"));
  m.def(
      "_synthetic_tokens",
      [](std::int64_t sequences, std::int64_t length, std::int64_t vocab, std::uint64_t seed) {
        return np::SyntheticTokens({sequences, length, vocab, seed});
      },
      py::arg("sequences"), py::arg("length"), py::arg("vocab"), py::arg("seed"));

  py::class_<np::GradientReducer>(m, "_GradientReducer")
      .def(py::init([](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group,
                       std::int64_t bucket_cap_bytes, std::int64_t first_bucket_bytes,
                       bool find_unused, bool bucket_view, std::vector<std::string> names) {
             np::ReducerOptions o;
             o.bucket_cap_bytes = bucket_cap_bytes;
             o.first_bucket_bytes = first_bucket_bytes;
             o.find_unused_parameters = find_unused;
             o.gradient_as_bucket_view = bucket_view;
             o.names = std::move(names);
             return std::make_unique<np::GradientReducer>(std::move(params), Owned(group), o);
           }),
           py::arg("params"), py::arg("group"), py::arg("bucket_cap_bytes"),
           py::arg("first_bucket_bytes"), py::arg("find_unused_parameters"),
           py::arg("gradient_as_bucket_view"), py::arg("names"))
      .def("prepare_for_backward", &np::GradientReducer::PrepareForBackward)
      .def("buckets",
           [](const np::GradientReducer& r) {
             std::vector<std::vector<std::size_t>> out;
             for (const auto& b : r.buckets()) out.push_back(b.parameters);
             return out;
           })
      .def("allreduces", &np::GradientReducer::allreduces);

  using np::ShardedUnit;
  py::class_<ShardedUnit>(m, "_ShardedUnit")
      .def(py::init([](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group, int stage,
                       const std::string& param_dtype, const std::string& reduce_dtype,
                       std::string name, bool offload, std::vector<bool> sequence_parallel,
                       ::c10d::ProcessGroup* sequence_parallel_group) {
             np::ShardingOptions o{stage, ParseFloatType(param_dtype),
                                   ParseFloatType(reduce_dtype), std::move(name), offload};
             if (sequence_parallel_group != nullptr) {
               o.sequence_parallel = std::move(sequence_parallel);
               o.sequence_parallel_group = Owned(*sequence_parallel_group);
             }
             return std::make_unique<ShardedUnit>(std::move(params), Owned(group), std::move(o));
           }),
           py::arg("params"), py::arg("group"), py::arg("stage"), py::arg("param_dtype"),
           py::arg("reduce_dtype"), py::arg("name"), py::arg("offload") = false,
           py::arg("sequence_parallel") = std::vector<bool>{},
           py::arg("sequence_parallel_group") = nullptr,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("shard_numel",
                             [](const ShardedUnit& u) { return u.shard().numel(); })
      .def_property_readonly("shard", &ShardedUnit::shard)
      .def_property_readonly("numel", &ShardedUnit::numel)
      .def_property_readonly("padded_numel", &ShardedUnit::padded_numel)
      .def_property_readonly("stage", &ShardedUnit::stage)
      .def_property_readonly("gathered", &ShardedUnit::gathered)
      .def_property_readonly("gathering", &ShardedUnit::gathering)
      .def("start_gather", &ShardedUnit::StartGather, py::call_guard<py::gil_scoped_release>())
      .def("gather", &ShardedUnit::Gather, py::call_guard<py::gil_scoped_release>())
      .def("free", &ShardedUnit::Free, py::call_guard<py::gil_scoped_release>())
      .def("mark_stale", &ShardedUnit::MarkStale, py::call_guard<py::gil_scoped_release>())
      .def("prepare_for_backward", &ShardedUnit::PrepareForBackward)
      .def("full_parameters", &ShardedUnit::FullParameters,
           py::call_guard<py::gil_scoped_release>())
      .def("load_full_parameters", &ShardedUnit::LoadFullParameters,
           py::call_guard<py::gil_scoped_release>())
      .def("unshard", &ShardedUnit::Unshard, py::call_guard<py::gil_scoped_release>())
      .def("shard_of", &ShardedUnit::Shard)
      .def("set_require_gradient_sync", &ShardedUnit::SetRequireGradientSync)
      .def("discard_accumulated_gradients", &ShardedUnit::DiscardAccumulatedGradients)
      .def("local_grad_squared_norm", &ShardedUnit::LocalGradSquaredNorm, py::arg("counted"));

  // Tensor / sequence parallel collectives (autograd functions).
  m.def("_copy_to_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::CopyToGroup(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_reduce_from_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::ReduceFromGroup(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_gather_from_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g,
                                 std::int64_t dim) { return np::GatherFromGroup(x, Owned(g), dim); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_scatter_to_group", [](const at::Tensor& x, ::c10d::ProcessGroup& g,
                                std::int64_t dim) { return np::ScatterToGroup(x, Owned(g), dim); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_gather_sequence", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::GatherSequence(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_reduce_scatter_sequence", [](const at::Tensor& x, ::c10d::ProcessGroup& g) {
    return np::ReduceScatterSequence(x, Owned(g));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_vocab_parallel_cross_entropy",
        [](const at::Tensor& logits, const at::Tensor& target, ::c10d::ProcessGroup& g,
           std::int64_t vocab_size) {
          return np::VocabParallelCrossEntropy(logits, target, Owned(g), vocab_size);
        }, py::call_guard<py::gil_scoped_release>());

  // Sharded checkpoints.
  m.def(
      "_set_grad",
      [](at::Tensor& param, const at::Tensor& grad) { param.mutable_grad() = grad; },
      py::arg("param"), py::arg("grad"),
      "Sets param.grad without torch's same-dtype check (a master shard's "
      "reduce_dtype gradient).");
  m.def(
      "_write_shard_file",
      [](const std::string& path, const std::vector<PieceTuple>& pieces) {
        std::vector<np::TensorPiece> out;
        for (const auto& [name, shape, dim, begin, data] : pieces) {
          out.push_back({name, shape, dim, begin, data});
        }
        const np::FileDigest d = np::WriteShardFile(path, out);
        return std::make_pair(d.bytes, d.checksum);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_read_shard_file",
      [](const std::string& dir, const FileTuple& file) {
        std::vector<PieceTuple> out;
        for (auto& p : np::ReadShardFile(dir, ToFile(file))) {
          out.emplace_back(p.name, p.full_shape, p.dim, p.begin, p.data);
        }
        return out;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("_write_manifest",
        [](const std::string& dir, std::int64_t step, const std::string& layout,
           const std::vector<FileTuple>& files,
           const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>&
               tensors) {
          np::proto::Manifest m;
          m.set_version(1);
          m.set_step(step);
          m.set_layout(layout);
          for (const auto& f : files) *m.add_files() = ToFile(f);
          for (const auto& [name, shape, dtype] : tensors) {
            auto* t = m.add_tensors();
            t->set_name(name);
            for (auto d : shape) t->add_full_shape(d);
            t->set_dtype(dtype);
          }
          np::WriteManifest(dir, m);
          np::RemoveUnlisted(dir, m);  // the previous save's files (best effort)
        });
  m.def("_read_manifest", [](const std::string& dir) {
    const np::proto::Manifest m = np::ReadManifest(dir);
    py::dict d;
    d["step"] = m.step();
    d["layout"] = m.layout();
    py::list files, tensors;
    for (const auto& f : m.files()) files.append(py::make_tuple(f.name(), f.bytes(), f.checksum()));
    for (const auto& t : m.tensors()) {
      tensors.append(py::make_tuple(
          t.name(), std::vector<std::int64_t>(t.full_shape().begin(), t.full_shape().end()),
          t.dtype()));
    }
    d["files"] = files;
    d["tensors"] = tensors;
    return d;
  });
  m.def("_assemble_full", [](const std::string& name, const std::vector<std::int64_t>& shape,
                             const std::vector<PieceTuple>& pieces, const std::string& dir) {
    std::vector<np::TensorPiece> owned;
    for (const auto& [n, s, dim, begin, data] : pieces) owned.push_back({n, s, dim, begin, data});
    std::vector<const np::TensorPiece*> ptrs;
    for (const auto& p : owned) ptrs.push_back(&p);
    return np::AssembleFull(name, shape, ptrs, dir);
  });

  // Pipeline parallelism.
  m.def(
      "_make_schedule",
      [](const std::string& kind, int stages, int microbatches, int chunks) {
        const np::PipelinePlan plan =
            np::MakeSchedule(np::ParseScheduleKind(kind), stages, microbatches, chunks);
        std::vector<std::vector<std::tuple<bool, int, int>>> order;
        for (const auto& stage : plan.order) {
          order.emplace_back();
          for (const auto& t : stage) order.back().emplace_back(t.forward, t.microbatch, t.chunk);
        }
        py::dict d;
        d["order"] = order;
        d["makespan"] = plan.makespan;
        d["ideal"] = plan.ideal;
        d["bubble"] = plan.bubble();
        d["max_in_flight"] = plan.max_in_flight;
        return d;
      },
      py::arg("kind"), py::arg("stages"), py::arg("microbatches"), py::arg("chunks"));
  py::class_<np::PipelineEngine>(m, "_PipelineEngine")
      .def(py::init([](int chunks, int microbatches, const std::string& schedule,
                       std::int64_t batch_dim, np::PipelineEngine::Chunk chunk,
                       np::PipelineEngine::Loss loss, ::c10d::ProcessGroup& group,
                       std::optional<np::PipelineEngine::Cost> cost) {
             return std::make_unique<np::PipelineEngine>(
                 np::PipelineOptions{chunks, microbatches, np::ParseScheduleKind(schedule),
                                     batch_dim},
                 std::move(chunk), std::move(loss), Owned(group),
                 cost ? std::move(*cost) : np::PipelineEngine::Cost());
           }),
           py::arg("chunks"), py::arg("microbatches"), py::arg("schedule"), py::arg("batch_dim"),
           py::arg("chunk"), py::arg("loss"), py::arg("group"), py::arg("cost"))
      .def(
          "step",
          [](np::PipelineEngine& e, std::optional<at::Tensor> inputs,
             std::optional<at::Tensor> targets) -> std::optional<at::Tensor> {
            at::Tensor loss =
                e.Step(inputs.value_or(at::Tensor()), targets.value_or(at::Tensor()));
            if (!loss.defined()) return std::nullopt;
            return loss;
          },
          py::arg("inputs"), py::arg("targets"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("is_first", &np::PipelineEngine::first)
      .def_property_readonly("is_last", &np::PipelineEngine::last)
      .def("stats", [](const np::PipelineEngine& e) {
        const auto& s = e.stats();
        py::dict d;
        d["modelled_step_us"] = s.modelled_step_us;
        d["compute_us"] = s.compute_us;
        d["bubble"] = s.bubble;
        d["schedule_bubble"] = s.schedule_bubble;
        d["formula_bubble"] = s.formula_bubble;
        return d;
      });
  m.def("_balanced_partition", &np::BalancedPartition, py::arg("costs"), py::arg("parts"));
  py::class_<PendingSends>(m, "_PendingSends")
      .def(py::init<>())
      .def("wait", &PendingSends::Wait, py::call_guard<py::gil_scoped_release>())
      .def("__len__", [](const PendingSends& p) { return p.works.size(); });
  m.def(
      "_send_stage_tensor",
      [](PendingSends& pending, const at::Tensor& t, ::c10d::ProcessGroup& g, int dst,
         bool gradient, int microbatch, int virtual_stage) {
        auto works = np::SendStageTensor(g, dst, t, {gradient, microbatch, virtual_stage});
        pending.works.insert(pending.works.end(), works.begin(), works.end());
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_recv_stage_tensor",
      [](::c10d::ProcessGroup& g, int src, bool gradient, int microbatch, int virtual_stage,
         std::optional<at::Tensor> like) {
        return np::RecvStageTensor(g, src, {gradient, microbatch, virtual_stage}, like);
      },
      py::arg("group"), py::arg("src"), py::arg("gradient"), py::arg("microbatch"),
      py::arg("virtual_stage"), py::arg("like") = py::none(),
      py::call_guard<py::gil_scoped_release>());

  m.def(
      "_average_gradients",
      [](std::vector<at::Tensor> params, ::c10d::ProcessGroup& group, std::int64_t bucket_bytes) {
        np::AverageGradients(params, group, bucket_bytes);
      },
      py::arg("params"), py::arg("group"), py::arg("bucket_bytes"),
      py::call_guard<py::gil_scoped_release>());
  m.def("_model_state_memory", [] {
    const np::ModelStateMemory m = np::ShardedModelStateMemory();
    return std::make_pair(m.current, m.peak);
  });
  m.def("_set_optimizer_state_bytes", &np::SetOptimizerStateBytes);
  m.def("_reset_model_state_peak", &np::ResetModelStatePeak);
  m.def(
      "_broadcast_coalesced",
      [](std::vector<at::Tensor> tensors, ::c10d::ProcessGroup& group, int root,
         std::int64_t bucket_bytes) {
        np::BroadcastCoalesced(std::move(tensors), group, root, bucket_bytes);
      },
      py::arg("tensors"), py::arg("group"), py::arg("root"), py::arg("bucket_bytes"),
      py::call_guard<py::gil_scoped_release>());
}
