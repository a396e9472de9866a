// tandem-model: model tools for checking a checkpoint against other
// implementations (services/model_tools/model_tools.h says what each does).
// `tandemctl <tool> ...` runs this binary with the same arguments.
//
//   tandem-model tokenize --model DIR            < text lines
//   tandem-model logprobs --model DIR --input F.jsonl
//   tandem-model generate --model DIR --prompt TEXT [--max-tokens N]
//                         [--temperature T] [--seed S]
//   tandem-model export --model DIR --output DIR
//   tandem-model task --split train|heldout [--count N] [--seed S]
//                     [--digits D] [--subtraction true|false]

#include <fstream>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "services/model_tools/model_tools.h"
#include "services/model_tools/task_export.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tandem-model: tokenize, score, generate with and export a model"};
  app.require_subcommand(1);
  std::string model_dir, input, output;
  tandem::model_tools::GenerateOptions generate_options;

  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "Text lines on stdin to JSON token ids, one line each");
  tokenize->add_option("--model", model_dir,
                       "Hugging Face model directory (empty: built-in)");
  CLI::App* logprobs = app.add_subcommand(
      "logprobs", "Per-token log-probs of {\"tokens\":[...]} lines");
  logprobs->add_option("--model", model_dir,
                       "Hugging Face model directory (empty: built-in)");
  logprobs->add_option("--input", input, "JSONL file (default: stdin)");
  CLI::App* generate =
      app.add_subcommand("generate", "Complete a prompt (greedy by default)");
  generate->add_option("--model", model_dir,
                       "Hugging Face model directory (empty: built-in)");
  generate->add_option("--prompt", generate_options.prompt, "Prompt text")
      ->required();
  generate->add_option("--max-tokens", generate_options.max_tokens,
                       "Most tokens to generate");
  generate->add_option("--temperature", generate_options.temperature,
                       "0 = greedy");
  generate->add_option("--seed", generate_options.seed, "Sampling seed");
  CLI::App* export_model = app.add_subcommand(
      "export",
      "Write the model back as a Hugging Face directory through Tandem's "
      "checkpoint writer");
  export_model->add_option("--model", model_dir,
                           "Hugging Face model directory (empty: built-in)");
  export_model->add_option("--output", output, "Output directory")->required();

  tandem::model_tools::TaskExportOptions task_options;
  CLI::App* task = app.add_subcommand(
      "task",
      "The built-in arithmetic task's train or held-out problems as JSONL "
      "({\"prompt\",\"answer\",\"id\"} lines, in stream order)");
  task->add_option("--split", task_options.split, "train or heldout")
      ->required();
  task->add_option("--count", task_options.count, "Problems to write");
  task->add_option("--seed", task_options.seed,
                   "Task seed (dataset.seed, eval.seed)");
  task->add_option("--digits", task_options.digits, "Operand digits");
  task->add_option("--subtraction", task_options.subtraction,
                   "Include subtraction problems");

  CLI11_PARSE(app, argc, argv);
  auto report = [](const absl::Status& status) {
    if (status.ok()) return 0;
    std::cerr << "tandem-model: " << status.message() << "\n";
    return 1;
  };
  namespace tools = tandem::model_tools;
  if (tokenize->parsed()) {
    return report(tools::Tokenize(model_dir, std::cin, std::cout));
  }
  if (logprobs->parsed()) {
    if (input.empty()) {
      return report(tools::LogProbs(model_dir, std::cin, std::cout));
    }
    std::ifstream file(input);
    if (!file) return report(absl::NotFoundError("cannot read " + input));
    return report(tools::LogProbs(model_dir, file, std::cout));
  }
  if (generate->parsed()) {
    return report(tools::Generate(model_dir, generate_options, std::cout));
  }
  if (export_model->parsed()) {
    return report(tools::Export(model_dir, output));
  }
  if (task->parsed()) {
    return report(tools::ExportTask(task_options, std::cout));
  }
  return 2;
}
