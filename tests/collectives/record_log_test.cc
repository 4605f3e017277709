// RecordLog: the latest records, oldest first, within a fixed capacity.
#include <gtest/gtest.h>

#include <vector>

#include "neuron/collectives/op_stats.h"

namespace neuron::collectives {
namespace {

std::vector<std::uint64_t> Sequences(const RecordLog& log) {
  std::vector<std::uint64_t> out;
  for (const OpRecord& r : log) out.push_back(r.sequence);
  return out;
}

TEST(RecordLog, KeepsTheLatestOldestFirst) {
  RecordLog log(3);
  EXPECT_TRUE(log.empty());
  for (std::uint64_t s = 0; s < 2; ++s) log.Append().sequence = s;
  EXPECT_EQ(Sequences(log), (std::vector<std::uint64_t>{0, 1}));
  for (std::uint64_t s = 2; s < 7; ++s) log.Append().sequence = s;
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(Sequences(log), (std::vector<std::uint64_t>{4, 5, 6}));
  EXPECT_EQ(log[0].sequence, 4u);
  EXPECT_EQ(log.back().sequence, 6u);
  // A copy as the process group hands them to Python.
  const std::vector<OpRecord> copy(log.begin(), log.end());
  ASSERT_EQ(copy.size(), 3u);
  EXPECT_EQ(copy[2].sequence, 6u);
}

TEST(RecordLog, AnOverwrittenRecordStartsFromDefaults) {
  RecordLog log(1);
  OpRecord& first = log.Append();
  first.op = "allreduce";
  first.registered = true;
  first.wall_us = 5;
  OpRecord& second = log.Append();
  EXPECT_EQ(log.size(), 1u);
  EXPECT_TRUE(second.op.empty());
  EXPECT_FALSE(second.registered);
  EXPECT_EQ(second.wall_us, 0);
}

TEST(RecordLog, ClearedStartsOverAndZeroCapacityKeepsOne) {
  RecordLog log(0);
  log.Append().sequence = 1;
  log.Append().sequence = 2;
  EXPECT_EQ(Sequences(log), (std::vector<std::uint64_t>{2}));
  log.clear();
  EXPECT_TRUE(log.empty());
  log.Append().sequence = 3;
  EXPECT_EQ(Sequences(log), (std::vector<std::uint64_t>{3}));
}

}  // namespace
}  // namespace neuron::collectives
