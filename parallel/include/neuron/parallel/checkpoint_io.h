// The files of a sharded checkpoint: every rank writes the pieces of the
// tensors it owns to shard-RANK.bin, then one rank writes manifest.textproto
// listing every file with its size and checksum and every tensor with its
// full shape. Each file is written to a temporary name, flushed and renamed,
// and the manifest comes last, so a checkpoint whose save was interrupted
// (a killed job) has no manifest and is never loaded; a shard file that
// changed since is refused by its checksum.
//
// Pieces are rectangular parts of the full (unsharded) tensors, so a
// checkpoint loads into any layout: assemble a full tensor from its pieces,
// then take the part the new layout needs.
//
//   FileDigest d = WriteShardFile(dir + "/shard-00003.bin", pieces);
//   ... manifest.add_files() with d, on one rank, after every rank wrote ...
//   WriteManifest(dir, manifest);
//   proto::Manifest m = ReadManifest(dir);
//   auto pieces = ReadShardFile(dir, m.files(3));
//   at::Tensor w = AssembleFull("blocks.0.mlp.fc1.weight", m, pieces_of_that_name, dir);
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "neuron/parallel/checkpoint.pb.h"

namespace neuron::parallel {

struct TensorPiece {
  std::string name;
  std::vector<std::int64_t> full_shape;
  int dim = -1;  // -1: the whole tensor
  std::int64_t begin = 0;
  at::Tensor data;  // the piece (its size along dim is the length)
};

struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

FileDigest WriteShardFile(const std::string& path, const std::vector<TensorPiece>& pieces);
// Verifies size and checksum against the manifest's entry (IoError naming
// the file otherwise).
std::vector<TensorPiece> ReadShardFile(const std::string& dir, const proto::ManifestFile& file);

void WriteManifest(const std::string& dir, const proto::Manifest& manifest);
// InvalidUsage when the directory holds no complete checkpoint.
proto::Manifest ReadManifest(const std::string& dir);
// Deletes the manifest (before a new save into `dir` starts).
void RemoveManifest(const std::string& dir);

// The full tensor `name` from `pieces` (all of that name), which must cover
// it exactly once; InvalidUsage naming the checkpoint and tensor otherwise.
at::Tensor AssembleFull(const std::string& name, const std::vector<std::int64_t>& full_shape,
                        const std::vector<const TensorPiece*>& pieces,
                        const std::string& checkpoint);

}  // namespace neuron::parallel
