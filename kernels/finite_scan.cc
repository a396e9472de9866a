#include "kernels/finite_scan.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tandem::kernels {
namespace {

// Elements OR-reduced per block before the block is searched: large enough
// to amortise the branch, small enough to stay in L1 for the search.
constexpr uint64_t kBlock = 2048;

template <typename Word, Word kExponent>
std::optional<NonFiniteValue> Find(const uint8_t* data, uint64_t n) {
  constexpr Word kMantissa =
      static_cast<Word>(~kExponent & (Word(~Word{0}) >> 1));
  constexpr Word kSign = static_cast<Word>(~(Word(~Word{0}) >> 1));
  auto load = [data](uint64_t i) {
    Word w;
    std::memcpy(&w, data + i * sizeof(Word), sizeof(Word));
    return w;
  };
  for (uint64_t begin = 0; begin < n; begin += kBlock) {
    const uint64_t end = begin + kBlock < n ? begin + kBlock : n;
    Word bad = 0;
    uint64_t i = begin;
#if defined(__SSE2__)
    // 32 bytes a step, explicitly: at -O2 the compiler does not vectorize
    // the loop below, which then runs at a quarter of memory bandwidth.
    constexpr uint64_t kStep = 32 / sizeof(Word);
    const __m128i exponent = sizeof(Word) == 2
                                 ? _mm_set1_epi16(static_cast<short>(kExponent))
                                 : _mm_set1_epi32(static_cast<int>(kExponent));
    __m128i any = _mm_setzero_si128();
    for (; i + kStep <= end; i += kStep) {
      const auto* p = reinterpret_cast<const __m128i*>(data + i * sizeof(Word));
      const __m128i a = _mm_and_si128(_mm_loadu_si128(p), exponent);
      const __m128i b = _mm_and_si128(_mm_loadu_si128(p + 1), exponent);
      if constexpr (sizeof(Word) == 2) {
        any = _mm_or_si128(any, _mm_or_si128(_mm_cmpeq_epi16(a, exponent),
                                             _mm_cmpeq_epi16(b, exponent)));
      } else {
        any = _mm_or_si128(any, _mm_or_si128(_mm_cmpeq_epi32(a, exponent),
                                             _mm_cmpeq_epi32(b, exponent)));
      }
    }
    bad |= static_cast<Word>(_mm_movemask_epi8(any) != 0);
#endif
    for (; i < end; ++i) {
      bad |= static_cast<Word>((load(i) & kExponent) == kExponent);
    }
    if (bad == 0) continue;
    for (uint64_t i = begin; i < end; ++i) {
      const Word w = load(i);
      if ((w & kExponent) == kExponent) {
        return NonFiniteValue{i, (w & kMantissa) != 0, (w & kSign) != 0};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

const char* FloatFormatName(FloatFormat format) {
  switch (format) {
    case FloatFormat::kF32:
      return "F32";
    case FloatFormat::kBF16:
      return "BF16";
    case FloatFormat::kF16:
      return "F16";
  }
  return "F32";
}

std::optional<NonFiniteValue> FindNonFinite(absl::Span<const uint8_t> bytes,
                                            FloatFormat format) {
  const uint64_t n = bytes.size() / FloatFormatSize(format);
  switch (format) {
    case FloatFormat::kF32:
      return Find<uint32_t, 0x7F800000u>(bytes.data(), n);
    case FloatFormat::kBF16:
      return Find<uint16_t, 0x7F80u>(bytes.data(), n);
    case FloatFormat::kF16:
      return Find<uint16_t, 0x7C00u>(bytes.data(), n);
  }
  return std::nullopt;
}

const char* NonFiniteName(const NonFiniteValue& value) {
  if (value.nan) return "NaN";
  return value.negative ? "-Inf" : "+Inf";
}

}  // namespace tandem::kernels
