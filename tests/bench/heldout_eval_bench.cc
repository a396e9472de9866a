// Held-out evaluation time: greedy exact match of a model on the built-in
// task's held-out problems, as the trainer's `eval.*` evaluation runs it
// (services/trainer/tools/sft/sft_eval.h, GreedyComplete through the
// engine). Prints one JSON line per run:
//
//   {"path":"engine","problems":256,"threads":1,"cpu_seconds":...,
//    "wall_seconds":...,"correct":...,"completions_hash":"..."}
//
//   heldout_eval_bench [--model DIR] [--digits D] [--subtraction 0|1]
//                      [--problems N[,N...]] [--repeat R] [--threads T]
//
// The task options default to the trainer's (eval.arith_digits 3, no
// subtraction, seed 0). --model: a Hugging Face directory (default: the
// built-in tiny model, random weights from seed 1). Each problem count runs
// once unmeasured (warm-up), then R times. cpu_seconds is the process's
// user + system time over the run (getrusage), wall_seconds the elapsed
// time. completions_hash is FNV-1a over every completion's tokens and stop
// flag: equal hashes, equal completions. (Until the engine took it over,
// held-out evaluation had a decode loop of its own; commit c927988 has
// both, and --path engine|loop|both to run them alternately.)

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/model/decoder_model.h"
#include "common/model/model_loader.h"
#include "common/task/arith_task.h"
#include "common/tokenizer/tokenizer.h"
#include "services/trainer/tools/sft/sft_eval.h"

namespace tandem::trainer::sft {
namespace {

struct Flags {
  std::string model;
  int digits = 3;
  bool subtraction = false;
  std::vector<int64_t> problems = {256, 1024};
  int repeat = 3;
  int threads = 1;
};

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 +
         usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
}

uint64_t Hash(const std::vector<GreedyCompletion>& completions) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (const GreedyCompletion& c : completions) {
    for (int32_t t : c.tokens) mix(static_cast<uint64_t>(t));
    mix(c.stopped ? 1000 : 2000);
  }
  return h;
}

absl::Status Run(const Flags& flags) {
  ASSIGN_OR_RETURN(model::LoadedModel loaded,
                   model::LoadModel(flags.model, /*seed=*/1, flags.threads));
  task::ArithTaskOptions task_options;
  task_options.digits = flags.digits;
  task_options.subtraction = flags.subtraction;
  ASSIGN_OR_RETURN(task::ArithTask task, task::ArithTask::Create(task_options));
  for (int64_t n : flags.problems) {
    const std::vector<task::ArithProblem> problems =
        task.Take(task::Split::kHeldOut, static_cast<uint64_t>(n));
    for (int run = -1; run < flags.repeat; ++run) {
      const double cpu_start = CpuSeconds();
      const absl::Time wall_start = absl::Now();
      absl::StatusOr<std::vector<GreedyCompletion>> completions =
          GreedyComplete(*loaded.decoder, *loaded.tokenizer, problems,
                         MaxAnswerTokens(flags.digits));
      const double cpu = CpuSeconds() - cpu_start;
      const double wall = absl::ToDoubleSeconds(absl::Now() - wall_start);
      RETURN_IF_ERROR(completions.status());
      if (run < 0) continue;  // warm-up
      int64_t correct = 0;
      for (size_t i = 0; i < problems.size(); ++i) {
        if (IsExactMatch((*completions)[i], problems[i])) ++correct;
      }
      std::printf(
          "{\"path\":\"engine\",\"problems\":%lld,\"threads\":%d,"
          "\"cpu_seconds\":%.4f,\"wall_seconds\":%.4f,\"correct\":%lld,"
          "\"completions_hash\":\"%016llx\"}\n",
          static_cast<long long>(n), flags.threads, cpu, wall,
          static_cast<long long>(correct),
          static_cast<unsigned long long>(Hash(*completions)));
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::trainer::sft

int main(int argc, char** argv) {
  tandem::trainer::sft::Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = value != nullptr;
    if (arg == "--model" && ok) {
      flags.model = value;
    } else if (arg == "--digits" && ok) {
      ok = absl::SimpleAtoi(value, &flags.digits);
    } else if (arg == "--subtraction" && ok) {
      ok = absl::SimpleAtob(value, &flags.subtraction);
    } else if (arg == "--problems" && ok) {
      flags.problems.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int64_t n = 0;
        ok = ok && absl::SimpleAtoi(part, &n) && n > 0;
        flags.problems.push_back(n);
      }
    } else if (arg == "--repeat" && ok) {
      ok = absl::SimpleAtoi(value, &flags.repeat) && flags.repeat > 0;
    } else if (arg == "--threads" && ok) {
      ok = absl::SimpleAtoi(value, &flags.threads) && flags.threads > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "heldout_eval_bench: bad argument %s%s%s\n",
                   arg.c_str(), value != nullptr ? " " : "",
                   value != nullptr ? value : "");
      return 2;
    }
    ++i;
  }
  const absl::Status status = tandem::trainer::sft::Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "heldout_eval_bench: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
