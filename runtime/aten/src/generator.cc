#include "neuron/aten/generator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace neuron::aten {
namespace {

// A search past this many words means `to` does not follow `from`: a bug,
// reported instead of looping (2^36 words take about two minutes).
constexpr std::uint64_t kMaxDraws = std::uint64_t{1} << 36;

void Draw(at::mt19937& engine, std::uint64_t words) {
  for (std::uint64_t i = 0; i < words; ++i) engine();
}

}  // namespace

std::uint64_t DrawsBetween(at::mt19937 from, const at::mt19937& to) {
  const at::mt19937_data_pod target = to.data();
  std::uint64_t drawn = 0;
  for (;;) {
    const at::mt19937_data_pod now = from.data();
    // Same block of 624 words: the positions in it differ by the draws.
    if (now.next_ <= target.next_ && now.state_ == target.state_) {
      return drawn + (target.next_ - now.next_);
    }
    // Draw to the first word of the next block (left_ words).
    Draw(from, static_cast<std::uint64_t>(now.left_));
    drawn += static_cast<std::uint64_t>(now.left_);
    TORCH_INTERNAL_ASSERT(drawn < kMaxDraws,
                          "neuron generator: the engine does not follow its anchor");
  }
}

NeuronGenerator::NeuronGenerator(std::uint64_t seed)
    : at::CPUGeneratorImpl(seed), anchor_(seed) {}

void NeuronGenerator::set_current_seed(std::uint64_t seed) {
  at::CPUGeneratorImpl::set_current_seed(seed);
  anchor_ = engine();
  anchor_offset_ = 0;
}

std::uint64_t NeuronGenerator::get_offset() const {
  const at::mt19937 now = const_cast<NeuronGenerator*>(this)->engine();
  anchor_offset_ += DrawsBetween(anchor_, now);
  anchor_ = now;
  return anchor_offset_;
}

void NeuronGenerator::set_offset(std::uint64_t offset) { MoveTo(current_seed(), offset); }

void NeuronGenerator::Save(std::uint64_t offset) const {
  auto* self = const_cast<NeuronGenerator*>(this);
  const std::uint64_t seed = current_seed();
  auto same = std::find_if(saved_.begin(), saved_.end(), [&](const Saved& s) {
    return s.seed == seed && s.offset == offset;
  });
  if (same != saved_.end()) saved_.erase(same);
  if (saved_.size() == kSaved) saved_.pop_front();
  saved_.push_back({seed, offset, self->engine(), self->next_float_normal_sample(),
                    self->next_double_normal_sample()});
}

// From the nearest known state at or before the target: a saved one, the
// engine now, or the seed itself.
void NeuronGenerator::MoveTo(std::uint64_t seed, std::uint64_t offset) {
  if (seed == current_seed() && offset == get_offset()) return;
  for (const Saved& s : saved_) {
    if (s.seed == seed && s.offset == offset) {
      set_engine(s.engine);
      set_next_float_normal_sample(s.next_float);
      set_next_double_normal_sample(s.next_double);
      anchor_ = s.engine;
      anchor_offset_ = offset;
      return;
    }
  }
  at::mt19937 start(seed);
  std::uint64_t at = 0;
  if (seed == current_seed() && anchor_offset_ <= offset) {
    start = anchor_;  // get_offset above moved the anchor to the engine
    at = anchor_offset_;
  }
  for (const Saved& s : saved_) {
    if (s.seed == seed && s.offset > at && s.offset <= offset) {
      start = s.engine;
      at = s.offset;
    }
  }
  Draw(start, offset - at);
  set_engine(start);
  set_next_float_normal_sample(std::nullopt);
  set_next_double_normal_sample(std::nullopt);
  anchor_ = start;
  anchor_offset_ = offset;
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGenerator::get_state() const {
  const std::uint64_t words[2] = {current_seed(), get_offset()};
  Save(words[1]);
  at::TensorBase state = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte,
                                               std::nullopt, std::nullopt, std::nullopt,
                                               std::nullopt);
  std::memcpy(state.mutable_data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

void NeuronGenerator::set_state(const c10::TensorImpl& state) {
  at::detail::check_rng_state(state);
  TORCH_CHECK(state.numel() == static_cast<int64_t>(kStateBytes),
              "neuron generator: RNG state must be ", kStateBytes,
              " bytes (a seed and an offset, as CUDA's), got ", state.numel());
  std::uint64_t words[2];
  std::memcpy(words, state.data(), kStateBytes);
  MoveTo(words[0], words[1]);
}

NeuronGenerator* NeuronGenerator::clone_impl() const {
  auto* self = const_cast<NeuronGenerator*>(this);
  auto* copy = new NeuronGenerator(current_seed());
  copy->set_engine(self->engine());
  copy->set_next_float_normal_sample(self->next_float_normal_sample());
  copy->set_next_double_normal_sample(self->next_double_normal_sample());
  copy->anchor_ = anchor_;
  copy->anchor_offset_ = anchor_offset_;
  copy->saved_ = saved_;
  return copy;
}

}  // namespace neuron::aten
