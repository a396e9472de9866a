// tandem-trainer: the trainer daemon, `tandem-trainer sft ...` for the
// supervised warm start of the built-in model (see docs/sft.md), or
// `tandem-trainer export ...` to write a checkpoint's policy as a Hugging
// Face directory (see docs/operations.md, "Checkpoints").

#include <cstring>

#include "common/daemon/daemon_main.h"
#include "services/trainer/tools/checkpoint_export.h"
#include "services/trainer/tools/inprocess_rl.h"
#include "services/trainer/tools/sft/sft_command.h"
#include "services/trainer/trainer.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "sft") == 0) {
    return tandem::trainer::sft::RunSftCommand(argc - 1, argv + 1);
  }
  if (argc > 1 && std::strcmp(argv[1], "rl-inprocess") == 0) {
    return tandem::trainer::RunInProcessRlCommand(argc - 1, argv + 1);
  }
  if (argc > 1 && std::strcmp(argv[1], "export") == 0) {
    return tandem::trainer::RunExportCommand(argc - 1, argv + 1);
  }
  return tandem::daemon::RunDaemon<tandem::trainer::Trainer,
                                   tandem::trainer::TrainerConfig>(argc, argv,
                                                                   "trainer");
}
