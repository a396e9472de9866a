#include "common/task/task_split.h"

namespace tandem::task {

const char* SplitName(Split split) {
  return split == Split::kTrain ? "train" : "heldout";
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Split SplitOfText(absl::string_view text, uint64_t salt,
                  int32_t heldout_percent) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  const uint64_t bucket = SplitMix64(h ^ salt) % 100;
  return bucket < static_cast<uint64_t>(heldout_percent) ? Split::kHeldOut
                                                         : Split::kTrain;
}

}  // namespace tandem::task
