// One decode step's products, by each way the model can compute them
// (issue 20): kernels::RowGemmF32 on every vector path this CPU has,
// against LibTorch's at::linear(x, W) and the weight-left form
// (W x^T)^T that common/model/layers.cc falls back to.
//
//   row_gemm_bench [--rows 1,2,8,16,24,32,48,64] [--layers 24]
//                  [--rounds 5] [--threads 1] [--tiles 4x3,2x6,...|all]
//
// The products are those of a model shaped like Qwen2.5-0.5B: per layer q
// and o (896 x 896), k and v (128 x 896), gate and up (4864 x 896), down
// (896 x 4864), then lm_head (151936 x 896); every layer has its own
// weights, so W streams from memory as in a real step (about 2 GB at 24
// layers). Each round runs every path once over the whole step, paths in
// a rotating order, and times it by the CPU time of the threads that ran
// it (this process's CPU time, so other processes' load counts less than
// in wall-clock time) and by the wall clock. Prints, per row count, the
// best and the median CPU milliseconds of each path and the row kernel's
// speed-up against both LibTorch forms (best against best). With
// --threads T > 1, LibTorch uses T threads and the row kernel is split
// into up to T column ranges, as the model does: "row <path>" on the shared
// RangePool (the model's way), "row <path> spawn" on a thread per range
// started per call (the model's way before the pool), "row <path> pf" by
// at::parallel_for (serial in our build: the reason for either). --tiles
// adds the AVX2 path with each given tile shape ("tile 4x3", split as
// "row avx2"): the sweep behind the choice of 4 x 3 and 2 x 6
// (kernels/row_gemm.h).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/range_pool.h"
#include "kernels/row_gemm.h"
#include "tests/bench/bench_util.h"

namespace tandem {
namespace {

[[noreturn]] void Die(const std::string& why) {
  bench::Die("row_gemm_bench", why);
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Options {
  std::vector<int64_t> rows = {1, 2, 8, 16, 24, 32, 48, 64};
  int layers = 24;
  int rounds = 5;
  int threads = 1;
  // --tiles: the AVX2 path with these tile shapes as paths of their own
  // ("tile 4x3" ...), for the tile sweep; empty: none.
  std::vector<kernels::Avx2Tile> tiles;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    int parsed = 0;
    if (flag == "--rows") {
      o.rows.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        if (!absl::SimpleAtoi(part, &parsed) || parsed < 1) {
          Die("--rows: '" + std::string(part) + "' is not a count >= 1");
        }
        o.rows.push_back(parsed);
      }
    } else if (flag == "--layers" || flag == "--rounds" ||
               flag == "--threads") {
      if (!absl::SimpleAtoi(value, &parsed) || parsed < 1) {
        Die(flag + ": '" + value + "' is not a count >= 1");
      }
      (flag == "--layers"   ? o.layers
       : flag == "--rounds" ? o.rounds
                            : o.threads) = parsed;
    } else if (flag == "--tiles") {
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        if (part == "all") {
          o.tiles = kernels::RowGemmAvx2TileShapes();
          continue;
        }
        const std::vector<std::string> rc = absl::StrSplit(part, 'x');
        kernels::Avx2Tile tile;
        bool known = false;
        if (rc.size() == 2 && absl::SimpleAtoi(rc[0], &tile.x_rows) &&
            absl::SimpleAtoi(rc[1], &tile.w_rows)) {
          for (const kernels::Avx2Tile& t : kernels::RowGemmAvx2TileShapes()) {
            known = known || (t.x_rows == tile.x_rows && t.w_rows == tile.w_rows);
          }
        }
        if (!known) {
          std::string shapes;
          for (const kernels::Avx2Tile& t : kernels::RowGemmAvx2TileShapes()) {
            shapes += " " + std::to_string(t.x_rows) + "x" +
                      std::to_string(t.w_rows);
          }
          Die("--tiles: '" + std::string(part) + "' is not one of" + shapes +
              " or all");
        }
        o.tiles.push_back(tile);
      }
    } else {
      Die("unknown flag " + flag +
          " (--rows LIST, --layers N, --rounds N, --threads N, --tiles LIST)");
    }
  }
  return o;
}

// The row kernel over all of W's rows, split into column ranges
// (kernels::RowGemmParts / RowGemmColumns) as common/model/layers.cc splits
// them: on the shared RangePool's threads ("pool", the model's way), or on
// a std::thread per range started and joined per call ("spawn", the model's
// way before the pool). The caller's thread runs the last range.
// `tile`, when set, runs the AVX2 path with that tile shape instead of
// `path`.
void RowKernel(kernels::RowGemmPath path, const at::Tensor& x,
               const at::Tensor& w, at::Tensor& y, int threads, bool spawn,
               const kernels::Avx2Tile* tile = nullptr) {
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  RangePool& pool = RangePool::Shared();
  const int64_t parts = kernels::RowGemmParts(
      n, spawn ? threads : std::min(threads, pool.max_parallel()));
  auto range = [&](int part) {
    const kernels::ColumnRange c = kernels::RowGemmColumns(n, parts, part);
    if (tile != nullptr) {
      if (!kernels::RowGemmF32Avx2Tile(*tile, xp, wp, yp, m, n, k, c.begin,
                                       c.end)) {
        Die("this CPU has no AVX2 + FMA for --tiles");
      }
      return;
    }
    kernels::RowGemmF32On(path, xp, wp, yp, m, n, k, c.begin, c.end);
  };
  if (!spawn) {
    pool.Run(static_cast<int>(parts), range);
    return;
  }
  std::vector<std::thread> started;
  for (int t = 0; t + 1 < parts; ++t) started.emplace_back(range, t);
  range(static_cast<int>(parts) - 1);
  for (std::thread& th : started) th.join();
}

struct Path {
  std::string name;
  std::function<void(const at::Tensor& x, const at::Tensor& w)> run;
  std::vector<double> cpu_ms, wall_ms;
};

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  at::set_num_threads(o.threads);
  at::manual_seed(1);
  const int64_t hidden = 896, kv = 128, inter = 4864, vocab = 151936;
  std::vector<at::Tensor> weights;
  for (int l = 0; l < o.layers; ++l) {
    for (auto [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{hidden, hidden},
                                                  {kv, hidden},
                                                  {kv, hidden},
                                                  {hidden, hidden},
                                                  {inter, hidden},
                                                  {inter, hidden},
                                                  {hidden, inter}}) {
      weights.push_back(at::randn({rows, cols}) * 0.02);
    }
  }
  weights.push_back(at::randn({vocab, hidden}) * 0.02);
  int64_t parameters = 0;
  for (const at::Tensor& w : weights) parameters += w.numel();
  const char* kernel =
      kernels::RowGemmF32Supports(kernels::RowGemmPath::kAvx512) ? "avx512"
      : kernels::RowGemmF32Supports(kernels::RowGemmPath::kAvx2)
          ? "avx2"
          : "none (portable loop only; not timed)";
  std::printf(
      "row_gemm_bench: %d layers + lm_head (%.2f GB of float32 "
      "weights), %d thread(s), %d rounds; this CPU's row kernel: %s\n",
      o.layers, static_cast<double>(parameters * 4) / 1e9, o.threads, o.rounds,
      kernel);
  std::printf("%5s  %-14s %10s %10s %10s\n", "rows", "path", "best_ms",
              "median_ms", "best_wall");
  for (const int64_t rows : o.rows) {
    const at::Tensor x_hidden = at::randn({rows, hidden});
    const at::Tensor x_inter = at::randn({rows, inter});
    auto x_for = [&](const at::Tensor& w) -> const at::Tensor& {
      return w.size(1) == hidden ? x_hidden : x_inter;
    };
    std::vector<Path> paths;
    paths.push_back(
        {"at::linear", [](const at::Tensor& x, const at::Tensor& w) {
           at::Tensor y = at::linear(x, w);
           (void)y;
         }});
    paths.push_back(
        {"weight-left", [](const at::Tensor& x, const at::Tensor& w) {
           at::Tensor y = at::mm(w, x.t()).t().contiguous();
           (void)y;
         }});
    for (auto [path, name] :
         std::vector<std::pair<kernels::RowGemmPath, const char*>>{
             {kernels::RowGemmPath::kAvx512, "row avx512"},
             {kernels::RowGemmPath::kAvx2, "row avx2"}}) {
      if (!kernels::RowGemmF32Supports(path)) continue;
      paths.push_back(
          {name, [path, &o](const at::Tensor& x, const at::Tensor& w) {
             at::Tensor y = at::empty({x.size(0), w.size(0)});
             RowKernel(path, x, w, y, o.threads, /*spawn=*/false);
           }});
      if (o.threads > 1) {
        paths.push_back(
            {std::string(name) + " spawn",
             [path, &o](const at::Tensor& x, const at::Tensor& w) {
               at::Tensor y = at::empty({x.size(0), w.size(0)});
               RowKernel(path, x, w, y, o.threads, /*spawn=*/true);
             }});
        // The same split by at::parallel_for, as common/model/layers.cc
        // does it (LibTorch's intra-op pool).
        paths.push_back(
            {std::string(name) + " pf",
             [path](const at::Tensor& x, const at::Tensor& w) {
               const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
               at::Tensor y = at::empty({m, n});
               const float* xp = x.data_ptr<float>();
               const float* wp = w.data_ptr<float>();
               float* yp = y.data_ptr<float>();
               at::parallel_for(0, (n + 3) / 4, 16, [&](int64_t b, int64_t e) {
                 kernels::RowGemmF32On(path, xp, wp, yp, m, n, k, b * 4,
                                       std::min(n, e * 4));
               });
             }});
      }
    }
    for (const kernels::Avx2Tile& tile : o.tiles) {
      paths.push_back(
          {"tile " + std::to_string(tile.x_rows) + "x" +
               std::to_string(tile.w_rows),
           [tile, &o](const at::Tensor& x, const at::Tensor& w) {
             at::Tensor y = at::empty({x.size(0), w.size(0)});
             RowKernel(kernels::RowGemmPath::kAvx2, x, w, y, o.threads,
                       /*spawn=*/false, &tile);
           }});
    }
    for (int round = -1; round < o.rounds; ++round) {  // -1: warm-up
      for (size_t i = 0; i < paths.size(); ++i) {
        Path& p = paths[(i + static_cast<size_t>(round + 1)) % paths.size()];
        const double cpu0 = ProcessCpuSeconds();
        const auto wall0 = std::chrono::steady_clock::now();
        for (const at::Tensor& w : weights) p.run(x_for(w), w);
        const double cpu = ProcessCpuSeconds() - cpu0;
        const double wall = bench::SecondsSince(wall0);
        if (round >= 0) {
          p.cpu_ms.push_back(1e3 * cpu);
          p.wall_ms.push_back(1e3 * wall);
        }
      }
    }
    double best_linear = 0, best_left = 0;
    for (const Path& p : paths) {
      const double best = *std::min_element(p.cpu_ms.begin(), p.cpu_ms.end());
      if (p.name == "at::linear") best_linear = best;
      if (p.name == "weight-left") best_left = best;
      std::printf("%5lld  %-14s %10.1f %10.1f %10.1f",
                  static_cast<long long>(rows), p.name.c_str(), best,
                  bench::Median(p.cpu_ms),
                  *std::min_element(p.wall_ms.begin(), p.wall_ms.end()));
      if (p.name.rfind("row", 0) == 0 || p.name.rfind("tile", 0) == 0) {
        std::printf("   linear/row %.2f  weight-left/row %.2f",
                    best_linear / best, best_left / best);
      }
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
