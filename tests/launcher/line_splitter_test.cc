#include "line_splitter.h"

#include <gtest/gtest.h>

#include <random>

namespace neuron::launcher {
namespace {

std::vector<std::string> Split(const std::vector<std::string>& chunks,
                               std::size_t max_line = 1 << 20) {
  std::vector<std::string> lines;
  LineSplitter s([&](std::string_view l) { lines.emplace_back(l); }, max_line);
  for (const auto& c : chunks) s.Feed(c);
  s.Finish();
  return lines;
}

TEST(LineSplitter, JoinsLinesCutAnywhere) {
  EXPECT_EQ(Split({"hel", "lo\nwor", "ld\n"}),
            (std::vector<std::string>{"hello", "world"}));
  EXPECT_EQ(Split({"a\nb\n\nc"}), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(Split({}), std::vector<std::string>{});
}

TEST(LineSplitter, RandomCutsGiveTheSameLines) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "line number " + std::to_string(i) + "\n";
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> chunks;
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 40)(rng);
      chunks.push_back(text.substr(pos, n));
      pos += n;
    }
    const auto lines = Split(chunks);
    ASSERT_EQ(lines.size(), 500u);
    for (int i = 0; i < 500; ++i) EXPECT_EQ(lines[i], "line number " + std::to_string(i));
  }
}

TEST(LineSplitter, OverlongLinesAreCut) {
  const auto lines = Split({std::string(25, 'x'), "\n"}, 10);
  EXPECT_EQ(lines, (std::vector<std::string>{std::string(10, 'x'), std::string(10, 'x'),
                                             std::string(5, 'x')}));
}

}  // namespace
}  // namespace neuron::launcher
