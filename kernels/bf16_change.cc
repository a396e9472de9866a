#include "kernels/bf16_change.h"

#include <cassert>

namespace tandem::kernels {

void FindChangedWords(absl::Span<const uint16_t> prev,
                      absl::Span<const uint16_t> next,
                      std::vector<uint64_t>* changed) {
  assert(prev.size() == next.size());
  ForEachChangedWord(prev, next,
                     [changed](size_t i) { changed->push_back(i); });
}

uint64_t CountChangedWords(absl::Span<const uint16_t> prev,
                           absl::Span<const uint16_t> next) {
  assert(prev.size() == next.size());
  uint64_t count = 0;
  ForEachChangedWord(prev, next, [&count](size_t) { ++count; });
  return count;
}

absl::Span<const uint16_t> AsWords(absl::Span<const uint8_t> bytes) {
  assert(bytes.size() % 2 == 0);
  assert(reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) == 0);
  return absl::Span<const uint16_t>(
      reinterpret_cast<const uint16_t*>(bytes.data()), bytes.size() / 2);
}

absl::Span<uint16_t> AsMutableWords(absl::Span<uint8_t> bytes) {
  assert(bytes.size() % 2 == 0);
  assert(reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) == 0);
  return absl::Span<uint16_t>(reinterpret_cast<uint16_t*>(bytes.data()),
                              bytes.size() / 2);
}

}  // namespace tandem::kernels
