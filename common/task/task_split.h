#pragma once

// What the generated tasks (arith, tools) share: the train/held-out split
// of a problem by a salted hash of its text, and a seeded, portable stream
// of numbers per (split, index), so Sample(split, i) needs no state and
// gives the same problem on every platform and standard library.

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::task {

enum class Split { kTrain, kHeldOut };

const char* SplitName(Split split);

// splitmix64: a small, well-mixed, portable hash/step function.
uint64_t SplitMix64(uint64_t x);

// The split of a problem whose text is `text`: FNV-1a over it, mixed with
// the task's own `salt` (so no other use of the hash decides it), then
// bucketed in [0, 100); buckets below `heldout_percent` are held out.
Split SplitOfText(absl::string_view text, uint64_t salt,
                  int32_t heldout_percent);

// The numbers problem `index` of `split` is drawn from: its own generator
// state, so it does not depend on the problems before it.
class SplitStream {
 public:
  SplitStream(uint64_t seed, Split split, uint64_t index)
      : state_(SplitMix64(
            seed ^
            SplitMix64(index * 2 + (split == Split::kHeldOut ? 1 : 0)))) {}
  uint64_t Next() { return state_ = SplitMix64(state_); }

 private:
  uint64_t state_;
};

// Problem `index` of `split`: drawn from its stream by `draw` until one
// lands in the split (rejection sampling keeps each problem's split).
// `task` has SplitOf(problem) -> Split.
template <typename Task, typename Draw>
auto SampleInSplit(const Task& task, uint64_t seed, Split split, uint64_t index,
                   Draw draw) {
  SplitStream stream(seed, split, index);
  while (true) {
    auto problem = draw(stream);
    if (task.SplitOf(problem) == split) return problem;
  }
}

// The first `count` problems of `split`.
template <typename Task>
auto TakeFromSplit(const Task& task, Split split, uint64_t count) {
  std::vector<decltype(task.Sample(split, 0))> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(task.Sample(split, i));
  return out;
}

}  // namespace tandem::task
