// The "neuron" device's random generator: the CPU's algorithm (PyTorch's
// Mersenne Twister, so a seeded run draws what the CPU draws) behind the
// state an accelerator's generator has in PyTorch: a seed and an offset
// (CUDA's and XPU's Philox state, 16 bytes), which DTensor's
// OffsetBasedRNGTracker and torch.random.fork_rng read and write.
//
// Usage:
//   at::Generator g = at::make_generator<NeuronGenerator>(seed);
//   auto* n = g.get<NeuronGenerator>();
//   std::uint64_t drawn = n->get_offset();   // 32-bit words drawn since the seed
//   n->set_offset(drawn + 1024);              // where 1024 more draws would leave it
//
// The offset counts the 32-bit words the engine has drawn since it was
// seeded, so (seed, offset) names one engine state: set_state and
// set_offset put the engine there (from the seed, or from a state this
// generator saw nearer the target, by drawing the words between), and a
// state from get_state draws the same numbers again. A float32 uniform_ or
// normal_ of n elements (n >= 16) draws n words, so DTensor's shards of one
// such tensor draw disjoint runs of one stream. The normal sampler's cached
// second value is kept only when a state goes back to one get_state saw.
//
// Moving by d words costs d draws (about 2 ns each here); reading the
// offset costs about as much as the draws since it was last read.
// Thread-safety: as every generator, callers hold its mutex().
#pragma once

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <deque>
#include <optional>

namespace neuron::aten {

class NeuronGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit NeuronGenerator(std::uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(std::uint64_t seed) override;
  void set_offset(std::uint64_t offset) override;
  std::uint64_t get_offset() const override;
  // 16 bytes: the seed, then the offset (uint64, little-endian), as CUDA's.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void set_state(const c10::TensorImpl& state) override;

  static constexpr std::size_t kStateBytes = 16;

 private:
  struct Saved {  // the engine at (seed, offset), with the normal sampler's cache
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;
    at::mt19937 engine;
    std::optional<float> next_float;
    std::optional<double> next_double;
  };

  NeuronGenerator* clone_impl() const override;
  // Puts the engine at `offset` words past `seed`.
  void MoveTo(std::uint64_t seed, std::uint64_t offset);
  // Remembers the engine's state (at most kSaved, the oldest dropped).
  void Save(std::uint64_t offset) const;

  static constexpr std::size_t kSaved = 16;
  // The engine as it was at anchor_offset_: the offset is anchor_offset_
  // plus the words drawn from anchor_ to the engine now.
  mutable at::mt19937 anchor_;
  mutable std::uint64_t anchor_offset_ = 0;
  mutable std::deque<Saved> saved_;
};

// The words `to` has drawn since `from` (`to` is `from` after some draws;
// a bounded search that throws when it is not).
std::uint64_t DrawsBetween(at::mt19937 from, const at::mt19937& to);

}  // namespace neuron::aten
