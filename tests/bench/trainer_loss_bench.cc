// Peak memory and time of token log-probs + GRPO loss + backward, chunked
// (ComputeTokenLogProbs) vs naive (full [T, vocab] logits), side by side in
// one process on the same inputs.
//
// Peak memory is the growth of the process's peak resident set (VmHWM, reset
// through /proc/self/clear_refs before each run) over the resident set just
// before the run; inputs and their gradient buffers' first-touch are
// included for both paths alike. Naive runs whose estimated peak exceeds
// --naive_limit_gib are skipped and reported as such.
//
//   trainer_loss_bench [--vocab=151936] [--hidden=896,4096]
//                      [--tokens=2048,4096,8192,16384] [--naive_limit_gib=12]
//                      [--chunk_tokens=2048] [--chunk_vocab=8192]
//                      [--max_seconds_per_hidden=...]

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "services/trainer/loss/chunked_logprobs.h"
#include "services/trainer/loss/grpo_loss.h"

namespace tandem::trainer {
namespace {

struct Flags {
  int64_t vocab = 151936;
  std::vector<int64_t> hidden = {896, 4096};
  std::vector<int64_t> tokens = {2048, 4096, 8192, 16384};
  double naive_limit_gib = 12.0;
  int64_t chunk_tokens = 2048;
  int64_t chunk_vocab = 8192;
};

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  while (*s != '\0') {
    char* end = nullptr;
    out.push_back(std::strtoll(s, &end, 10));
    s = (*end == ',') ? end + 1 : end;
    if (end == s && *end != '\0') break;
  }
  return out;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const auto value = [a](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return std::strncmp(a, name, n) == 0 ? a + n : nullptr;
    };
    if (const char* v = value("--vocab=")) {
      f.vocab = std::atoll(v);
    } else if (const char* v = value("--hidden=")) {
      f.hidden = ParseList(v);
    } else if (const char* v = value("--tokens=")) {
      f.tokens = ParseList(v);
    } else if (const char* v = value("--naive_limit_gib=")) {
      f.naive_limit_gib = std::atof(v);
    } else if (const char* v = value("--chunk_tokens=")) {
      f.chunk_tokens = std::atoll(v);
    } else if (const char* v = value("--chunk_vocab=")) {
      f.chunk_vocab = std::atoll(v);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a);
      std::exit(2);
    }
  }
  return f;
}

// kB field of /proc/self/status, in bytes.
int64_t StatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0) {
      return std::atoll(line.c_str() + n + 1) * 1024;
    }
  }
  return -1;
}

void ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

struct Inputs {
  at::Tensor hidden;        // [T, H]
  at::Tensor lm_head;       // [V, H]
  at::Tensor targets;       // [T]
  PackedPolicyBatch batch;  // everything but new_logprobs / entropy
};

// Sequences of 512 tokens (first 64 are prompt, masked out), groups of 8,
// random 0/1 rewards; behavior log-probs are filled in after a first pass.
Inputs MakeInputs(int64_t tokens, int64_t hidden, int64_t vocab) {
  at::manual_seed(tokens * 7 + hidden);
  Inputs in;
  in.hidden = at::randn({tokens, hidden}) * 0.05;
  in.lm_head = at::randn({vocab, hidden}) * 0.05;
  in.targets = at::randint(vocab, {tokens}, at::kLong);
  const int64_t seq_len = 512;
  const int64_t num_seq = (tokens + seq_len - 1) / seq_len;
  at::Tensor pos = at::arange(tokens, at::kLong);
  in.batch.sequence_ids = pos.div(seq_len, "floor");
  in.batch.mask = (pos.remainder(seq_len) >= 64).to(at::kFloat);
  in.batch.rewards = at::randint(2, {num_seq}).to(at::kFloat);
  in.batch.group_ids = at::arange(num_seq, at::kLong).div(8, "floor");
  return in;
}

struct Measured {
  double seconds = 0.0;
  double peak_gib = 0.0;
  double loss = 0.0;
};

double Gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

Measured RunOnce(const Inputs& in, const TokenLogProbsOptions& options,
                 bool naive) {
  at::Tensor h = in.hidden.detach().requires_grad_(true);
  at::Tensor w = in.lm_head.detach().requires_grad_(true);
  ResetPeakRss();
  const int64_t rss_before = StatusBytes("VmRSS:");
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TokenLogProbs> lp =
      naive ? ComputeTokenLogProbsNaive(h, w, in.targets, options)
            : ComputeTokenLogProbs(h, w, in.targets, options);
  if (!lp.ok()) {
    std::fprintf(stderr, "%s\n", lp.status().ToString().c_str());
    std::exit(1);
  }
  PackedPolicyBatch batch = in.batch;
  batch.new_logprobs = lp->logprobs;
  batch.entropy = lp->entropy;
  GrpoLossOptions loss_options;
  absl::StatusOr<GrpoLossResult> loss = ComputeGrpoLoss(batch, loss_options);
  if (!loss.ok()) {
    std::fprintf(stderr, "%s\n", loss.status().ToString().c_str());
    std::exit(1);
  }
  loss->loss.backward();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  Measured m;
  m.seconds = seconds;
  m.peak_gib = Gib(StatusBytes("VmHWM:") - rss_before);
  m.loss = loss->stats.loss;
  return m;
}

}  // namespace
}  // namespace tandem::trainer

int main(int argc, char** argv) {
  using namespace tandem::trainer;
  const Flags flags = ParseFlags(argc, argv);
  TokenLogProbsOptions options;
  options.chunk_tokens = flags.chunk_tokens;
  options.chunk_vocab = flags.chunk_vocab;
  std::printf("vocab %lld, chunks %lld x %lld tokens x vocab, %d threads\n",
              static_cast<long long>(flags.vocab),
              static_cast<long long>(flags.chunk_tokens),
              static_cast<long long>(flags.chunk_vocab), at::get_num_threads());
  std::printf("%6s %6s | %10s %8s | %10s %8s | %9s %9s | %s\n", "hidden",
              "tokens", "chunk_GiB", "chunk_s", "naive_GiB", "naive_s",
              "mem_ratio", "time_ratio", "loss chunk/naive");
  for (int64_t hidden : flags.hidden) {
    for (int64_t tokens : flags.tokens) {
      Inputs in = MakeInputs(tokens, hidden, flags.vocab);
      {
        // Behavior log-probs: the policy's own, perturbed (a stale worker).
        c10::NoGradGuard no_grad;
        absl::StatusOr<TokenLogProbs> lp =
            ComputeTokenLogProbs(in.hidden, in.lm_head, in.targets, options);
        in.batch.behavior_logprobs = lp->logprobs + 0.1 * at::randn({tokens});
      }
      const Measured chunked = RunOnce(in, options, /*naive=*/false);
      // Naive holds about four [T, V] float32 tensors at its peak
      // (logits, log_softmax, the gather's scattered gradient and
      // log_softmax's input gradient) plus the [V, H] head gradient.
      const double naive_estimate_gib =
          Gib(4 * tokens * flags.vocab * 4 + flags.vocab * hidden * 4);
      std::printf(
          "%6lld %6lld | %10.3f %8.2f | ", static_cast<long long>(hidden),
          static_cast<long long>(tokens), chunked.peak_gib, chunked.seconds);
      if (naive_estimate_gib > flags.naive_limit_gib) {
        std::printf("%10s %8s | %9s %9s | skipped: naive est. %.1f GiB\n", "-",
                    "-", "-", "-", naive_estimate_gib);
      } else {
        const Measured naive = RunOnce(in, options, /*naive=*/true);
        std::printf("%10.3f %8.2f | %9.3f %9.3f | %.6g / %.6g\n",
                    naive.peak_gib, naive.seconds,
                    chunked.peak_gib / naive.peak_gib,
                    chunked.seconds / naive.seconds, chunked.loss, naive.loss);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
