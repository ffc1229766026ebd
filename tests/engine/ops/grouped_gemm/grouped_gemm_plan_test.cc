#include "engine/ops/grouped_gemm/grouped_gemm_plan.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain::ops {
namespace {

std::vector<int64_t> OffsetsFromSizes(const std::vector<int64_t>& group_rows) {
  std::vector<int64_t> offsets = {0};
  for (int64_t rows : group_rows) offsets.push_back(offsets.back() + rows);
  return offsets;
}

struct Expected {
  int64_t group, row_begin, rows;
  int stream;
};

void ExpectProblems(const GroupedGemmPlan& plan, const std::vector<Expected>& want) {
  ASSERT_EQ(plan.problems.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(plan.problems[i].group, want[i].group);
    EXPECT_EQ(plan.problems[i].row_begin, want[i].row_begin);
    EXPECT_EQ(plan.problems[i].rows, want[i].rows);
    EXPECT_EQ(plan.problems[i].stream, want[i].stream);
  }
}

TEST(GroupedGemmPlanTest, SkipsEmptyGroupsAndAssignsStreamsRoundRobin) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({0, 1, 7, 0, 130, 33, 5, 0});
  for (GroupedGemmKind kind : {GroupedGemmKind::kForward, GroupedGemmKind::kBackwardData,
                               GroupedGemmKind::kBackwardWeight}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const GroupedGemmPlan plan = PlanGroupedGemm(kind, offsets, 9, 11, false, 4);
    // Streams count only issued products: the fifth non-empty group wraps to stream 0.
    ExpectProblems(plan,
                   {{1, 0, 1, 0}, {2, 1, 7, 1}, {4, 8, 130, 2}, {5, 138, 33, 3}, {6, 171, 5, 0}});
    EXPECT_EQ(plan.streams_used, 4);
    EXPECT_FALSE(plan.zero_whole_output);
  }
}

TEST(GroupedGemmPlanTest, FewProblemsUseFewStreams) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({0, 3, 0, 4});
  const GroupedGemmPlan plan = PlanGroupedGemm(GroupedGemmKind::kForward, offsets, 2, 2, false, 4);
  ExpectProblems(plan, {{1, 0, 3, 0}, {3, 3, 4, 1}});
  EXPECT_EQ(plan.streams_used, 2);

  const GroupedGemmPlan one_stream =
      PlanGroupedGemm(GroupedGemmKind::kForward, offsets, 2, 2, false, 1);
  ExpectProblems(one_stream, {{1, 0, 3, 0}, {3, 3, 4, 0}});
  EXPECT_EQ(one_stream.streams_used, 1);
}

TEST(GroupedGemmPlanTest, OneGroupHoldsEveryRow) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({0, 0, 171, 0});
  const GroupedGemmPlan plan =
      PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, 5, 6, false, 4);
  ExpectProblems(plan, {{2, 0, 171, 0}});
  EXPECT_EQ(plan.streams_used, 1);
  ASSERT_EQ(plan.zero_groups.size(), 2u);
  EXPECT_EQ(plan.zero_groups[0].begin, 0);
  EXPECT_EQ(plan.zero_groups[0].end, 2);
  EXPECT_EQ(plan.zero_groups[1].begin, 3);
  EXPECT_EQ(plan.zero_groups[1].end, 4);
}

TEST(GroupedGemmPlanTest, BackwardWeightZeroesEmptyGroupsOnlyWithoutAccumulation) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({0, 1, 7, 0, 0, 130, 0});
  const GroupedGemmPlan overwrite =
      PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, 3, 4, false, 4);
  // Runs of empty groups coalesce: {0}, {3, 4}, {6}.
  ASSERT_EQ(overwrite.zero_groups.size(), 3u);
  EXPECT_EQ(overwrite.zero_groups[0].begin, 0);
  EXPECT_EQ(overwrite.zero_groups[0].end, 1);
  EXPECT_EQ(overwrite.zero_groups[1].begin, 3);
  EXPECT_EQ(overwrite.zero_groups[1].end, 5);
  EXPECT_EQ(overwrite.zero_groups[2].begin, 6);
  EXPECT_EQ(overwrite.zero_groups[2].end, 7);

  const GroupedGemmPlan accumulate =
      PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, 3, 4, true, 4);
  EXPECT_TRUE(accumulate.zero_groups.empty());
  EXPECT_EQ(accumulate.problems.size(), 3u);

  // The activation products never zero per group: every row of their output is some group's.
  for (GroupedGemmKind kind : {GroupedGemmKind::kForward, GroupedGemmKind::kBackwardData}) {
    EXPECT_TRUE(PlanGroupedGemm(kind, offsets, 3, 4, false, 4).zero_groups.empty());
  }
}

TEST(GroupedGemmPlanTest, NoRowsAtAll) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({0, 0, 0});
  for (GroupedGemmKind kind : {GroupedGemmKind::kForward, GroupedGemmKind::kBackwardData}) {
    const GroupedGemmPlan plan = PlanGroupedGemm(kind, offsets, 3, 4, false, 4);
    EXPECT_TRUE(plan.problems.empty());
    EXPECT_EQ(plan.streams_used, 0);
    EXPECT_FALSE(plan.zero_whole_output);
  }
  const GroupedGemmPlan weight =
      PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, 3, 4, false, 4);
  EXPECT_TRUE(weight.problems.empty());
  EXPECT_EQ(weight.streams_used, 0);
  ASSERT_EQ(weight.zero_groups.size(), 1u);
  EXPECT_EQ(weight.zero_groups[0].begin, 0);
  EXPECT_EQ(weight.zero_groups[0].end, 3);
}

TEST(GroupedGemmPlanTest, EmptyInnerDimensionZeroesTheWholeOutput) {
  const std::vector<int64_t> offsets = OffsetsFromSizes({2, 0, 3});
  // Forward sums over K, backward data over N.
  const GroupedGemmPlan forward =
      PlanGroupedGemm(GroupedGemmKind::kForward, offsets, 3, 0, false, 4);
  EXPECT_TRUE(forward.zero_whole_output);
  EXPECT_TRUE(forward.problems.empty());
  EXPECT_EQ(forward.streams_used, 0);
  const GroupedGemmPlan data =
      PlanGroupedGemm(GroupedGemmKind::kBackwardData, offsets, 0, 4, false, 4);
  EXPECT_TRUE(data.zero_whole_output);
  EXPECT_TRUE(data.problems.empty());
  // An empty output needs nothing at all.
  EXPECT_FALSE(
      PlanGroupedGemm(GroupedGemmKind::kForward, offsets, 0, 4, false, 4).zero_whole_output);
  EXPECT_FALSE(
      PlanGroupedGemm(GroupedGemmKind::kBackwardData, offsets, 3, 0, false, 4).zero_whole_output);
  const GroupedGemmPlan weight =
      PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, 3, 0, false, 4);
  EXPECT_TRUE(weight.problems.empty());
  EXPECT_TRUE(weight.zero_groups.empty());
  EXPECT_FALSE(weight.zero_whole_output);
}

TEST(GroupedGemmPlanTest, OffsetsPastTwoToThe31) {
  const int64_t big = (int64_t{1} << 31) + 5;
  const std::vector<int64_t> offsets = {0, big, big, 2 * big, 2 * big + 1};
  const GroupedGemmPlan plan = PlanGroupedGemm(GroupedGemmKind::kForward, offsets, 7, 8, false, 4);
  ExpectProblems(plan, {{0, 0, big, 0}, {2, big, big, 1}, {3, 2 * big, 1, 2}});
  EXPECT_EQ(plan.streams_used, 3);
}

}  // namespace
}  // namespace moetrain::ops
