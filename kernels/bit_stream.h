#pragma once

// LSB-first bit writer and bounds-checked reader used by the delta codec,
// with Rice (Golomb power-of-two) codes that escape to a raw form when the
// quotient would be long. Internal to kernels/; not a stable format on its
// own (bf16_delta.h documents the format that uses it).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tandem::kernels::internal {

// A quotient of kRiceEscape or more is written as kRiceEscape one-bits
// followed by the value in raw form, bounding both code length and decode
// loops on malformed input.
inline constexpr int kRiceEscape = 24;

inline constexpr uint64_t LowBits(int n) {
  return n >= 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1);
}

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}

  // Writes the low `n` bits of `bits`, n in [0, 64].
  void Put(uint64_t bits, int n) {
    if (n > 32) {
      Put(bits, 32);
      Put(bits >> 32, n - 32);
      return;
    }
    acc_ |= (bits & LowBits(n)) << fill_;
    fill_ += n;
    if (fill_ >= 32) {
      const uint32_t word = static_cast<uint32_t>(acc_);
      const size_t at = out_->size();
      out_->resize(at + 4);
      std::memcpy(out_->data() + at, &word, 4);
      acc_ >>= 32;
      fill_ -= 32;
    }
  }

  // `q` one-bits then a zero bit.
  void PutUnary(uint64_t q) {
    while (q >= 32) {
      Put(0xFFFFFFFFu, 32);
      q -= 32;
    }
    Put(LowBits(static_cast<int>(q)), static_cast<int>(q) + 1);
  }

  // Rice code with parameter k for a value whose raw escape form is
  // `escape_bits` wide (16 for values); escape_bits == 0 selects the
  // self-delimiting escape for 64-bit gaps (6-bit length, then the bits).
  void PutRice(uint64_t v, int k, int escape_bits) {
    const uint64_t q = k >= 64 ? 0 : v >> k;
    if (q < kRiceEscape) {
      PutUnary(q);
      Put(v, k);
      return;
    }
    Put(LowBits(kRiceEscape), kRiceEscape);
    if (escape_bits > 0) {
      Put(v, escape_bits);
    } else {
      const int len = v == 0 ? 1 : std::bit_width(v);
      Put(static_cast<uint64_t>(len - 1), 6);
      Put(v, len);
    }
  }

  // Pads with zero bits to a byte boundary and flushes.
  void Finish() {
    while (fill_ > 0) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
    acc_ = 0;
  }

 private:
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// Exact bit cost of BitWriter::PutRice, for choosing parameters.
inline uint64_t RiceCost(uint64_t v, int k, int escape_bits) {
  const uint64_t q = k >= 64 ? 0 : v >> k;
  if (q < kRiceEscape) return q + 1 + static_cast<uint64_t>(k);
  if (escape_bits > 0) return kRiceEscape + escape_bits;
  return kRiceEscape + 6 + (v == 0 ? 1 : std::bit_width(v));
}

// Reads what BitWriter wrote from [data, data + size). Reading past the end
// yields zero bits and sets overrun(); callers check it once per block.
class BitReader {
 public:
  BitReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  // Returns `n` bits, n in [0, 64].
  uint64_t Get(int n) {
    if (n > 32) {
      const uint64_t lo = Get(32);
      return lo | (Get(n - 32) << 32);
    }
    if (avail_ < n) Refill();
    if (avail_ < n) {
      overrun_ = true;
      const uint64_t v = buf_;
      buf_ = 0;
      consumed_bits_ += avail_;
      avail_ = 0;
      return v & LowBits(n);
    }
    const uint64_t v = buf_ & LowBits(n);
    Consume(n);
    return v;
  }

  // Counts one-bits up to a terminating zero (consumed) or up to `max`
  // one-bits (no terminator consumed then).
  int GetUnary(int max) {
    int q = 0;
    for (;;) {
      if (avail_ < 32) Refill();
      if (avail_ == 0) {
        overrun_ = true;
        return max;
      }
      const uint64_t inv = ~buf_;
      int ones = inv == 0 ? 64 : std::countr_zero(inv);
      if (ones > avail_) ones = avail_;
      if (q + ones >= max) {
        Consume(max - q);
        return max;
      }
      if (ones < avail_) {
        Consume(ones + 1);
        return q + ones;
      }
      q += ones;
      Consume(ones);
    }
  }

  uint64_t GetRice(int k, int escape_bits) {
    const int q = GetUnary(kRiceEscape);
    if (q < kRiceEscape) {
      return (static_cast<uint64_t>(q) << k) | Get(k);
    }
    if (escape_bits > 0) return Get(escape_bits);
    const int len = static_cast<int>(Get(6)) + 1;
    return Get(len);
  }

  bool overrun() const { return overrun_; }
  uint64_t consumed_bits() const { return consumed_bits_; }

 private:
  void Consume(int n) {
    buf_ = n >= 64 ? 0 : buf_ >> n;
    avail_ -= n;
    consumed_bits_ += static_cast<uint64_t>(n);
  }

  void Refill() {
    if (end_ - p_ >= 8) {
      uint64_t v;
      std::memcpy(&v, p_, 8);
      const int bytes = (63 - avail_) >> 3;
      if (bytes == 0) return;
      buf_ |= (bytes == 8 ? v : (v & LowBits(bytes * 8))) << avail_;
      p_ += bytes;
      avail_ += bytes * 8;
      return;
    }
    while (avail_ <= 56 && p_ < end_) {
      buf_ |= static_cast<uint64_t>(*p_++) << avail_;
      avail_ += 8;
    }
  }

  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t buf_ = 0;
  int avail_ = 0;
  uint64_t consumed_bits_ = 0;
  bool overrun_ = false;
};

}  // namespace tandem::kernels::internal
