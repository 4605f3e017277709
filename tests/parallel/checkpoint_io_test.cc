#include "neuron/parallel/checkpoint_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "../helpers/mutator.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"
#include "neuron/runtime/fnv.h"

namespace neuron::parallel {
namespace {

std::string TempDir() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ckpt_test_" + std::to_string(::getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(CheckpointIo, PiecesRoundTripThroughFilesAndAssembleIntoTheFullTensor) {
  const std::string dir = TempDir();
  const at::Tensor full = at::arange(5 * 3, at::kFloat).view({5, 3});
  // Two tensor-parallel halves of 3 rows each, the last padded: rows [0,3) and [3,5).
  const FileDigest a = WriteShardFile(dir + "/shard-0.bin", {{"w", {5, 3}, 0, 0, full.narrow(0, 0, 3)}}, "");
  const FileDigest b = WriteShardFile(dir + "/shard-1.bin",
                                      {{"w", {5, 3}, 0, 3, full.narrow(0, 3, 2)},
                                       {"step", {}, -1, 0, at::scalar_tensor(4, at::kLong)}}, "");
  proto::Manifest m;
  m.set_version(1);
  for (auto [name, d] : {std::pair{"shard-0.bin", a}, {"shard-1.bin", b}}) {
    auto* f = m.add_files();
    f->set_name(name);
    f->set_bytes(d.bytes);
    f->set_checksum(d.checksum);
  }
  WriteManifest(dir, m, "");
  const proto::Manifest read = ReadManifest(dir, "");
  std::vector<TensorPiece> pieces;
  for (const auto& f : read.files()) {
    for (auto& p : ReadShardFile(dir, f, "")) pieces.push_back(std::move(p));
  }
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_TRUE(at::equal(AssembleFull("w", {5, 3}, {&pieces[0], &pieces[1]}, dir), full));
  EXPECT_EQ(AssembleFull("step", {}, {&pieces[2]}, dir).item<std::int64_t>(), 4);
  // A gap or an overlap is refused, naming the tensor.
  try {
    AssembleFull("w", {5, 3}, {&pieces[0]}, dir);
    ADD_FAILURE() << "a gap was accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w': its pieces do not cover it exactly once"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(AssembleFull("w", {5, 3}, {&pieces[0], &pieces[0], &pieces[1]}, dir),
               InvalidUsage);
  // Files of other saves go once a manifest is in place; listed ones stay.
  WriteShardFile(dir + "/shard-0-old.bin", {}, "");
  EXPECT_EQ(RemoveUnlisted(dir, ReadManifest(dir, "")), std::vector<std::string>{"shard-0-old.bin"});
  EXPECT_TRUE(std::filesystem::exists(dir + "/shard-0.bin"));
  std::filesystem::remove(dir + "/manifest.textproto");
  EXPECT_THROW(ReadManifest(dir, ""), InvalidUsage);
  std::filesystem::remove_all(dir);
}

// `key`: "" for an unkeyed checkpoint.
proto::Manifest OneFileManifest(const std::string& dir, const std::string& key = "",
                                const at::Tensor& w = at::ones({2})) {
  const FileDigest d = WriteShardFile(dir + "/shard-0.bin", {{"w", {2}, -1, 0, w}}, key);
  proto::Manifest m;
  m.set_version(1);
  m.set_step(7);
  auto* f = m.add_files();
  f->set_name("shard-0.bin");
  f->set_bytes(d.bytes);
  f->set_checksum(d.checksum);
  f->set_mac(d.mac);
  return m;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CheckpointIo, AManifestChangedAfterItWasWrittenIsRefused) {
  const std::string dir = TempDir();
  WriteManifest(dir, OneFileManifest(dir), "");
  EXPECT_EQ(ReadManifest(dir, "").step(), 7);
  const std::string path = dir + "/manifest.textproto";
  std::string text = ReadAll(path);
  const auto at = text.find("step: 7");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 7, "step: 9");  // a rewritten step
  std::ofstream(path) << text;
  try {
    ReadManifest(dir, "");
    ADD_FAILURE() << "an edited manifest was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.textproto does not carry the checksum of its "
                                         "contents"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

std::string LoadError(const std::string& dir, const std::string& key) {
  try {
    const proto::Manifest m = ReadManifest(dir, key);
    for (const auto& f : m.files()) ReadShardFile(dir, f, key);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// With a key, a forger who recomputes every checksum cannot make a changed
// weight load: not as an unkeyed checkpoint, not under a key of their own,
// not by replacing a shard; the owner's key loads the owner's checkpoint.
TEST(CheckpointIo, KeyedCheckpointsLoadOnlyUnderTheirKey) {
  const std::string dir = TempDir();
  const std::string key = "the owner's secret, 32 bytes....";
  WriteManifest(dir, OneFileManifest(dir, key), key);
  EXPECT_EQ(LoadError(dir, key), "");
  EXPECT_NE(ReadAll(dir + "/manifest.textproto").find("# mac hmac-sha256 "), std::string::npos);
  EXPECT_NE(LoadError(dir, "").find("manifest.textproto is keyed (HMAC-SHA256): set "
                                    "$NEURON_CHECKPOINT_SECRET to the secret it was saved with"),
            std::string::npos);
  const proto::Manifest owners = OneFileManifest(dir, key);
  // The forger's weight, as an unkeyed checkpoint with recomputed checksums.
  const proto::Manifest forged = OneFileManifest(dir, "", at::full({2}, 2.0));
  WriteManifest(dir, forged, "");
  EXPECT_NE(LoadError(dir, key).find("was saved without a key (FNV-1a checksums) and "
                                     "$NEURON_CHECKPOINT_SECRET is set"),
            std::string::npos);
  const std::string other = "a forger's own secret, 32 bytes.";
  WriteManifest(dir, OneFileManifest(dir, other, at::full({2}, 2.0)), other);
  EXPECT_NE(LoadError(dir, key).find("does not carry the MAC of its contents under "
                                     "$NEURON_CHECKPOINT_SECRET"),
            std::string::npos);
  // The owner's manifest over a replaced shard (its FNV-1a checksum set right).
  WriteManifest(dir, owners, key);
  OneFileManifest(dir, "", at::full({2}, 2.0));
  const std::string shard = ReadAll(dir + "/shard-0.bin");
  proto::Manifest patched = owners;
  patched.mutable_files(0)->set_checksum(runtime::Fnv1a(shard.data(), shard.size()));
  WriteManifest(dir, patched, key);
  EXPECT_NE(LoadError(dir, key).find("shard-0.bin does not carry the MAC the manifest "
                                     "gives it"),
            std::string::npos)
      << LoadError(dir, key);
  std::filesystem::remove_all(dir);
}

TEST(CheckpointIo, LoadingRemovesTheTemporariesOfWritersThatDied) {
  const std::string dir = TempDir();
  WriteManifest(dir, OneFileManifest(dir), "");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // gone: its pid names no process
  const std::string dead = "shard-1.bin.tmp." + std::to_string(child);
  const std::string alive = "shard-2.bin.tmp." + std::to_string(::getpid());
  std::ofstream(dir + "/" + dead) << "partial";
  std::ofstream(dir + "/" + alive) << "being written";
  ReadManifest(dir, "");
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + dead));
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + alive));
  std::filesystem::remove_all(dir);
}

// A link planted where the old predictable temporary (NAME.tmp.<pid>) would
// be is never followed: the temporary has a random name, created with
// O_EXCL | O_NOFOLLOW. A link planted at the manifest itself is an error
// naming it. The victim file is untouched either way.
TEST(CheckpointIo, PlantedLinksAreNotFollowed) {
  const std::string dir = TempDir();
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious";
  const std::string manifest = dir + "/manifest.textproto";
  std::filesystem::create_symlink(victim, manifest + ".tmp." + std::to_string(::getpid()));
  WriteManifest(dir, OneFileManifest(dir), "");
  EXPECT_EQ(runtime::ReadFile(victim, "victim"), "precious");
  EXPECT_EQ(ReadManifest(dir, "").files_size(), 1);
  std::filesystem::remove(manifest);
  std::filesystem::create_symlink(victim, manifest);
  try {
    WriteManifest(dir, OneFileManifest(dir), "");
    ADD_FAILURE() << "wrote through a link at " << manifest;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(manifest + ": it is a symbolic link, not followed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(runtime::ReadFile(victim, "victim"), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(manifest));
  // No temporary is left behind by the refused write.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name.find(".tmp.") == std::string::npos ||
                name == "manifest.textproto.tmp." + std::to_string(::getpid()))
        << name;
  }
  std::filesystem::remove_all(dir);
}

// A manifest's file names are plain names in the checkpoint's directory:
// "../other/shard-0.bin" (another checkpoint's shard, its size and checksum
// recomputed into the manifest), an absolute path, or a link out of the
// directory is refused naming the manifest's entry, and nothing of the file
// outside (its size, its checksum) is in the error.
TEST(CheckpointIo, ManifestNamesArePlainNamesInsideTheCheckpoint) {
  const std::string root = TempDir(), dir = root + "/a", other = root + "/b";
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(other);
  proto::Manifest m = OneFileManifest(other);  // b/shard-0.bin, its digest
  auto expect_refused = [&](const std::string& name, const std::string& shown) {
    m.mutable_files(0)->set_name(name);
    WriteManifest(dir, m, "");  // a valid checksum: as a forger would recompute it
    for (int reading_shard = 0; reading_shard < 2; ++reading_shard) {
      try {
        if (reading_shard) {
          ReadShardFile(dir, m.files(0), "");
        } else {
          ReadManifest(dir, "");
        }
        ADD_FAILURE() << "accepted the file name " << shown;
      } catch (const IoError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("manifest.textproto lists the file '" + shown +
                            "', not a plain file name in the checkpoint directory"),
                  std::string::npos)
            << what;
        EXPECT_EQ(what.find("checksum"), std::string::npos) << what;
      }
    }
  };
  expect_refused("../b/shard-0.bin", "../b/shard-0.bin");
  expect_refused(other + "/shard-0.bin", other + "/shard-0.bin");
  expect_refused("..", "..");
  expect_refused(std::string("shard\0.bin", 10), "shard\\x00.bin");
  expect_refused("manifest.textproto", "manifest.textproto");
  // A plain name that is a link out of the directory is not followed.
  std::filesystem::create_symlink(other + "/shard-0.bin", dir + "/shard-0.bin");
  m.mutable_files(0)->set_name("shard-0.bin");
  WriteManifest(dir, m, "");
  try {
    ReadShardFile(dir, ReadManifest(dir, "").files(0), "");
    ADD_FAILURE() << "read a shard through a link";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/shard-0.bin: it is a symbolic link, not "
                                         "followed"),
              std::string::npos)
        << e.what();
  }
  // The manifest itself is not read through a link either.
  std::filesystem::remove(dir + "/manifest.textproto");
  std::filesystem::create_symlink(other + "/manifest.textproto", dir + "/manifest.textproto");
  WriteManifest(other, OneFileManifest(other), "");
  EXPECT_THROW(ReadManifest(dir, ""), IoError);
  std::filesystem::remove_all(root);
}

// Fuzzed manifests with their checksum line recomputed (as a forger would):
// each is read or refused with neuron::Error, and one that is read lists
// only plain names, so no shard is looked for outside the checkpoint.
TEST(CheckpointIo, FuzzedManifestsWithRecomputedChecksumsNameOnlyTheirOwnFiles) {
  const std::string dir = TempDir();
  proto::Manifest seed_manifest = OneFileManifest(dir);
  auto* t = seed_manifest.add_tensors();
  t->set_name("w");
  t->add_full_shape(2);
  t->set_dtype("float32");
  *seed_manifest.add_files() = seed_manifest.files(0);
  seed_manifest.mutable_files(1)->set_name("shard-1.bin");
  WriteManifest(dir, seed_manifest, "");
  const std::string path = dir + "/manifest.textproto";
  const std::string written = ReadAll(path);
  const std::string seed = written.substr(written.find('\n', written.find('\n') + 1) + 1);
  std::mt19937_64 rng(7);
  neuron::testing::Fuzz("checkpoint manifest", seed, [&](const std::string& mutated) {
    // Half the inputs also get a path into a file name: the mutator's
    // tokens do not make one.
    std::string text = mutated;
    const std::size_t name = text.find("name: \"shard-");
    if (rng() % 2 == 0 && name != std::string::npos) {
      static const char* const kPaths[] = {"../", "/", "./", "a/../../", "..\""};
      text.insert(name + 7, kPaths[rng() % 5]);
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(runtime::Fnv1a(text.data(), text.size())));
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << "# torchneuron sharded checkpoint\n# checksum fnv1a64 " << hex << "\n" << text;
    const proto::Manifest read = ReadManifest(dir, "");
    for (const auto& f : read.files()) {
      ASSERT_TRUE(!f.name().empty() && f.name().find('/') == std::string::npos &&
                  f.name() != "." && f.name() != "..")
          << "a manifest naming '" << f.name() << "' was accepted";
    }
  });
  std::filesystem::remove_all(dir);
}

// A piece whose shape claims far more than its data: refused before
// anything is allocated.
TEST(CheckpointIo, APieceLargerThanItsDataIsRefusedWithoutAllocating) {
  const std::string dir = TempDir();
  proto::ShardFile file;
  auto* p = file.add_pieces();
  p->set_name("w");
  p->add_full_shape(std::int64_t{1} << 40);
  p->add_full_shape(std::int64_t{1} << 40);
  p->set_dim(-1);
  p->set_dtype("float32");
  p->set_data(std::string(8, '\0'));
  const std::string bytes = std::string("NCKPTv1\n", 8) + file.SerializeAsString();
  runtime::WriteFileAtomically(dir + "/shard-0.bin", bytes);
  proto::ManifestFile entry;
  entry.set_name("shard-0.bin");
  entry.set_bytes(bytes.size());
  entry.set_checksum(runtime::Fnv1a(bytes.data(), bytes.size()));
  try {
    ReadShardFile(dir, entry, "");
    ADD_FAILURE() << "a 2^80-element piece was accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("is not a tensor's"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Shard files with valid frames and manifest entries but mutated contents:
// read as pieces or refused with neuron::Error (never a huge allocation).
TEST(CheckpointIo, FuzzedShardFilesAreReadOrRefused) {
  const std::string dir = TempDir();
  WriteShardFile(dir + "/seed.bin", {{"w", {4, 3}, 0, 1, at::ones({2, 3})},
                                     {"step", {}, -1, 0, at::scalar_tensor(3, at::kLong)}}, "");
  const std::string seed = runtime::ReadFile(dir + "/seed.bin", "seed");
  neuron::testing::Fuzz("checkpoint shard", seed, [&](const std::string& bytes) {
    runtime::WriteFileAtomically(dir + "/shard-0.bin", bytes);
    proto::ManifestFile entry;
    entry.set_name("shard-0.bin");
    entry.set_bytes(bytes.size());
    entry.set_checksum(runtime::Fnv1a(bytes.data(), bytes.size()));
    ReadShardFile(dir, entry, "");
  });
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace neuron::parallel
