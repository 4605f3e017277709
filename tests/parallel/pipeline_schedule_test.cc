#include "neuron/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <set>

#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

// Every task once; per stage, a microbatch's backward after its forward.
void ExpectComplete(const PipelinePlan& plan, int p, int m, int v, const std::string& what) {
  for (int s = 0; s < p; ++s) {
    std::set<std::tuple<bool, int, int>> seen;
    for (const PipelineTask& t : plan.order[s]) {
      EXPECT_TRUE(seen.insert({t.forward, t.microbatch, t.chunk}).second) << what;
      if (!t.forward) {
        EXPECT_TRUE(seen.count({true, t.microbatch, t.chunk})) << what;
      }
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(2 * m * v)) << what << " stage " << s;
  }
}

TEST(PipelineSchedule, GPipeAnd1F1BHaveTheClassicBubbleForAnyMicrobatchCount) {
  for (int p : {1, 2, 3, 4}) {
    for (int m : {1, 2, 3, 5, 8}) {
      for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneForwardOneBackward}) {
        const PipelinePlan plan = MakeSchedule(kind, p, m);
        const std::string what = "p=" + std::to_string(p) + " m=" + std::to_string(m);
        ExpectComplete(plan, p, m, 1, what);
        EXPECT_NEAR(plan.bubble(), (p - 1.0) / (m + p - 1.0), 1e-9) << what;
        if (kind == ScheduleKind::kOneForwardOneBackward) {
          for (int s = 0; s < p; ++s) EXPECT_LE(plan.max_in_flight[s], p - s) << what;
        } else {
          EXPECT_EQ(plan.max_in_flight[0], m) << what;
        }
      }
    }
  }
}

TEST(PipelineSchedule, OneForwardOneBackwardAlternatesAfterWarmUp) {
  const PipelinePlan plan = MakeSchedule(ScheduleKind::kOneForwardOneBackward, 4, 6);
  std::string stage0;
  for (const PipelineTask& t : plan.order[0]) {
    stage0 += (t.forward ? "F" : "B") + std::to_string(t.microbatch) + " ";
  }
  EXPECT_EQ(stage0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
}

TEST(PipelineSchedule, InterleavingShrinksTheBubbleByTheChunkCount) {
  for (int p : {2, 4}) {
    for (int m : {4, 8, 5}) {
      const PipelinePlan one = MakeSchedule(ScheduleKind::kOneForwardOneBackward, p, m);
      const PipelinePlan two = MakeSchedule(ScheduleKind::kInterleaved, p, m, 2);
      const std::string what = "p=" + std::to_string(p) + " m=" + std::to_string(m);
      ExpectComplete(two, p, m, 2, what);
      // Any microbatch count runs; a partial last group of p gains less.
      EXPECT_LE(two.bubble(), one.bubble()) << what;
      if (m % p == 0) {  // (p-1)/(v m) of the ideal time
        EXPECT_LT(two.bubble(), one.bubble()) << what;
        EXPECT_NEAR(two.makespan / two.ideal - 1, (p - 1.0) / (2.0 * m), 1e-9) << what;
      }
    }
  }
}

TEST(PipelineSchedule, BadArgumentsAreNamed) {
  EXPECT_THROW(MakeSchedule(ScheduleKind::kGPipe, 0, 4), InvalidUsage);
  EXPECT_THROW(MakeSchedule(ScheduleKind::kGPipe, 2, 0), InvalidUsage);
  EXPECT_THROW(MakeSchedule(ScheduleKind::kOneForwardOneBackward, 2, 4, 2), InvalidUsage);
  EXPECT_THROW(ParseScheduleKind("zb"), InvalidUsage);
}

TEST(BalancedPartition, MinimisesTheLargestStage) {
  EXPECT_EQ(BalancedPartition({1, 1, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(BalancedPartition({5, 1, 1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 6}));
  EXPECT_EQ(BalancedPartition({1, 2, 3, 4, 5}, 3), (std::vector<int>{0, 3, 4, 5}));
  EXPECT_EQ(BalancedPartition({3}, 1), (std::vector<int>{0, 1}));
  EXPECT_THROW(BalancedPartition({1, 2}, 3), InvalidUsage);
}

}  // namespace
}  // namespace neuron::parallel
