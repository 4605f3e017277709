#include "neuron/parallel/checkpoint_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "neuron/runtime/error.h"

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
  const FileDigest a = WriteShardFile(dir + "/shard-0.bin", {{"w", {5, 3}, 0, 0, full.narrow(0, 0, 3)}});
  const FileDigest b = WriteShardFile(dir + "/shard-1.bin",
                                      {{"w", {5, 3}, 0, 3, full.narrow(0, 3, 2)},
                                       {"step", {}, -1, 0, at::scalar_tensor(4, at::kLong)}});
  proto::Manifest m;
  m.set_version(1);
  for (auto [name, d] : {std::pair{"shard-0.bin", a}, {"shard-1.bin", b}}) {
    auto* f = m.add_files();
    f->set_name(name);
    f->set_bytes(d.bytes);
    f->set_checksum(d.checksum);
  }
  WriteManifest(dir, m);
  const proto::Manifest read = ReadManifest(dir);
  std::vector<TensorPiece> pieces;
  for (const auto& f : read.files()) {
    for (auto& p : ReadShardFile(dir, f)) pieces.push_back(std::move(p));
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
  WriteShardFile(dir + "/shard-0-old.bin", {});
  EXPECT_EQ(RemoveUnlisted(dir, ReadManifest(dir)), std::vector<std::string>{"shard-0-old.bin"});
  EXPECT_TRUE(std::filesystem::exists(dir + "/shard-0.bin"));
  std::filesystem::remove(dir + "/manifest.textproto");
  EXPECT_THROW(ReadManifest(dir), InvalidUsage);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace neuron::parallel
