// torchneuron._C's sharded checkpoints: shard files and manifests.
#include "bindings.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "neuron/parallel/checkpoint_io.h"

namespace py = pybind11;
namespace np = neuron::parallel;

namespace {

using PieceTuple = std::tuple<std::string, std::vector<std::int64_t>, int, std::int64_t, at::Tensor>;
// (name, bytes, FNV-1a checksum, hex MAC or "")
using FileTuple = std::tuple<std::string, std::uint64_t, std::uint64_t, std::string>;

np::proto::ManifestFile ToFile(const FileTuple& f) {
  np::proto::ManifestFile out;
  out.set_name(std::get<0>(f));
  out.set_bytes(std::get<1>(f));
  out.set_checksum(std::get<2>(f));
  out.set_mac(std::get<3>(f));
  return out;
}

}  // namespace

void BindCheckpoint(py::module_& m) {
  m.def(
      "_write_shard_file",
      [](const std::string& path, const std::vector<PieceTuple>& pieces) {
        std::vector<np::TensorPiece> out;
        for (const auto& [name, shape, dim, begin, data] : pieces) {
          out.push_back({name, shape, dim, begin, data});
        }
        const np::FileDigest d = np::WriteShardFile(path, out, np::CheckpointKey());
        return std::make_tuple(d.bytes, d.checksum, d.mac);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_read_shard_file",
      [](const std::string& dir, const FileTuple& file) {
        std::vector<PieceTuple> out;
        for (auto& p : np::ReadShardFile(dir, ToFile(file), np::CheckpointKey())) {
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
          np::WriteManifest(dir, m, np::CheckpointKey());
          np::RemoveUnlisted(dir, m);  // the previous save's files (best effort)
        });
  m.def("_read_manifest", [](const std::string& dir) {
    const np::proto::Manifest m = np::ReadManifest(dir, np::CheckpointKey());
    py::dict d;
    d["step"] = m.step();
    d["layout"] = m.layout();
    py::list files, tensors;
    for (const auto& f : m.files()) files.append(py::make_tuple(f.name(), f.bytes(), f.checksum(), f.mac()));
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
}
