// torchneuron._C's parallel layout: the mesh, the data sampler and the
// synthetic token data of neuron::parallel, for torchneuron.parallel.
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/distributed_sampler.h"
#include "neuron/parallel/mesh_layout.h"
#include "neuron/parallel/token_data.h"
#include "neuron/runtime/error.h"

namespace py = pybind11;
namespace np = neuron::parallel;

namespace {

np::Axis ParseAxis(const std::string& axis) {
  if (axis == "tensor") return np::Axis::kTensor;
  if (axis == "data") return np::Axis::kData;
  if (axis == "pipeline") return np::Axis::kPipeline;
  throw neuron::InvalidUsage("parallel layout: axis must be tensor, data or pipeline, got '" +
                             axis + "'");
}

np::SamplerOptions Sampler(std::int64_t size, int replicas, int rank, bool shuffle,
                           std::uint64_t seed, bool drop_last) {
  return {size, replicas, rank, shuffle, seed, drop_last};
}

}  // namespace

void BindParallelLayout(py::module_& m) {
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
}
