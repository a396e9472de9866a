#pragma once

// What the C++ benchmarks share: wall time since a point, the median of a
// round's samples, and how a benchmark gives up.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace tandem::bench {

// Seconds from `since` to now (steady clock).
inline double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       since)
      .count();
}

// The median of `v` (the mean of the middle two for an even count).
// REQUIRES: !v.empty().
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Prints "<program>: <why>" and exits 1.
[[noreturn]] inline void Die(const char* program, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", program, why.c_str());
  std::exit(1);
}

}  // namespace tandem::bench
