// The files of a sharded checkpoint: every rank writes the pieces of the
// tensors it owns to shard-RANK-SAVE.bin (SAVE: a name of this save), then
// one rank writes manifest.textproto listing every file with its size and
// checksum and every tensor with its full shape. Each file is written to a
// temporary name, flushed and renamed, and the manifest comes last (an
// atomic rename over the previous one): a save that was interrupted (a
// killed job) leaves the previous checkpoint whole and loadable, and its own
// files are never loaded; a shard file that changed since is refused by its
// checksum. Once the new manifest is in place the previous save's files are
// removed (RemoveUnlisted).
//
// Keyed or not: with a checkpoint key (CheckpointKey(): the secret in
// $NEURON_CHECKPOINT_SECRET) every file carries an HMAC-SHA256 under it and
// the manifest's second line is the HMAC of its text, so a forger without
// the key cannot make a changed file or manifest load. Without one the
// checksums are FNV-1a: they catch damage and edits, not a forger who
// recomputes them. A load with a key trusts only keyed checkpoints (an
// unkeyed one is refused, or a forger would strip the MACs); a keyed
// checkpoint loads only with its key.
//
// Pieces are rectangular parts of the full (unsharded) tensors, so a
// checkpoint loads into any layout: assemble a full tensor from its pieces,
// then take the part the new layout needs.
//
//   const std::string key = CheckpointKey();
//   FileDigest d = WriteShardFile(dir + "/shard-00003-00000100-9f3a0c2e.bin", pieces, key);
//   ... manifest.add_files() with d, on one rank, after every rank wrote ...
//   WriteManifest(dir, manifest, key);
//   proto::Manifest m = ReadManifest(dir, key);
//   auto pieces = ReadShardFile(dir, m.files(3), key);
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
  std::uint64_t checksum = 0;  // FNV-1a of the whole file
  std::string mac;             // hex HMAC-SHA256 under the key; "" when unkeyed
};

// The checkpoint key: $NEURON_CHECKPOINT_SECRET, or "" when it is unset.
// InvalidUsage when it is too short to be a secret (auth::CheckSecret).
std::string CheckpointKey();

// `key`: CheckpointKey()'s, "" for an unkeyed checkpoint.
FileDigest WriteShardFile(const std::string& path, const std::vector<TensorPiece>& pieces,
                          const std::string& key);
// Verifies size and checksum (with a key: its MAC) against the manifest's
// entry (IoError naming the file otherwise). IoError too when the entry's
// name is not a plain file name in `dir` or the file is a symbolic link
// (never followed).
std::vector<TensorPiece> ReadShardFile(const std::string& dir, const proto::ManifestFile& file,
                                       const std::string& key);

// Atomically, and with the directory synced (the rename is durable); with
// a key the manifest carries the MAC of its text, else its checksum.
void WriteManifest(const std::string& dir, const proto::Manifest& manifest,
                   const std::string& key);
// InvalidUsage when the directory holds no complete checkpoint; IoError
// when the manifest's checksum or MAC (its second line) does not match its
// text, when it is keyed and `key` is "" or another key, when it is unkeyed
// and `key` is not "", when it is a symbolic link, or when it lists a file
// name that is not a plain name in `dir` ("../x", "/x", ".."): nothing
// outside is ever read. Removes the temporaries that writers which died
// left (RemoveStaleTemporaries).
proto::Manifest ReadManifest(const std::string& dir, const std::string& key);
// Deletes `dir`'s temporaries (NAME.tmp.PID.RANDOM) whose writer PID is gone: a
// killed save's, each as large as its shard. Never throws; returns their names.
std::vector<std::string> RemoveStaleTemporaries(const std::string& dir);
// Deletes the shard files in `dir` that `manifest` does not list (those of
// earlier saves, and of saves that did not finish, with their temporaries)
// and leftover temporaries of the manifest; returns their names. Best
// effort: never throws. Called once the new manifest is in place.
std::vector<std::string> RemoveUnlisted(const std::string& dir, const proto::Manifest& manifest);

// The full tensor `name` from `pieces` (all of that name), which must cover
// it exactly once; InvalidUsage naming the checkpoint and tensor otherwise.
at::Tensor AssembleFull(const std::string& name, const std::vector<std::int64_t>& full_shape,
                        const std::vector<const TensorPiece*>& pieces,
                        const std::string& checkpoint);

}  // namespace neuron::parallel
