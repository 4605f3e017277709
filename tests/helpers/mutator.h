// A small deterministic mutation fuzzer for the project's parsers: each run
// takes a valid input and applies a few random edits (byte flips, deletions,
// duplicated spans, and tokens parsers trip on: huge, negative, non-finite
// numbers, unbalanced braces). A parser under test must accept the result or
// reject it with neuron::Error; a crash, an abort or a hang fails the test
// binary.
//
// Usage:
//   Fuzz("topology", seed_text, [](const std::string& input) {
//     Topology::FromText(input, "fuzz");
//   });
//
// Bounded: kRuns inputs per parser or kBudget of wall time, whichever ends
// first; the seed of the generator is fixed, so a failure reproduces.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::testing {

inline constexpr int kRuns = 3000;
inline constexpr std::chrono::seconds kBudget{4};

inline std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const char* const kTokens[] = {
      "-1", "0", "1e308", "-1e308", "nan", "inf", "1e-300", "2147483647", "4294967296",
      "18446744073709551615", "-9223372036854775808", "{", "}", "[", "]", ":", "\"", "\\",
      "\n", " ", "\x00", "\xff", "65536", "1000000", "true", "0x7f"};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const std::size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!s.empty()) s[at % s.size()] = static_cast<char>(rng());
        break;
      case 1:  // delete a span
        if (!s.empty()) s.erase(at % s.size(), 1 + rng() % 16);
        break;
      case 2:  // duplicate a span
        if (!s.empty()) s.insert(at, s.substr(at % s.size(), 1 + rng() % 64));
        break;
      default: {  // a token that parsers trip on, over a number if one is here
        const std::string token = kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
        std::size_t end = at;
        while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) ||
                                  s[end] == '.' || s[end] == '-')) {
          ++end;
        }
        s.replace(at, end - at, token);
      }
    }
  }
  return s;
}

// Runs `parse` on mutations of `seed`; counts the inputs it accepted and
// those it refused with neuron::Error (any other exception fails).
inline void Fuzz(const std::string& what, const std::string& seed,
                 const std::function<void(const std::string&)>& parse) {
  std::mt19937_64 rng(0x5eed);
  const auto deadline = std::chrono::steady_clock::now() + kBudget;
  int accepted = 0, refused = 0;
  ASSERT_NO_THROW(parse(seed)) << what << ": the seed itself must parse";
  for (int i = 0; i < kRuns && std::chrono::steady_clock::now() < deadline; ++i) {
    const std::string input = Mutate(seed, rng);
    try {
      parse(input);
      ++accepted;
    } catch (const neuron::Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": input " << i << " raised a non-project exception: " << e.what();
      return;
    }
  }
  EXPECT_GT(refused, 0) << what << ": no mutation was refused: the fuzzer reaches nothing";
  std::cout << what << ": " << accepted << " accepted, " << refused << " refused\n";
}

}  // namespace neuron::testing
