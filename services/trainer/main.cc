// tandem-trainer: the trainer daemon, or `tandem-trainer sft ...` for the
// supervised warm start of the built-in model (see docs/sft.md).

#include <cstring>

#include "common/daemon/daemon_main.h"
#include "services/trainer/sft/sft_command.h"
#include "services/trainer/trainer.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "sft") == 0) {
    return tandem::trainer::sft::RunSftCommand(argc - 1, argv + 1);
  }
  return tandem::daemon::RunDaemon<tandem::trainer::Trainer,
                                   tandem::trainer::TrainerConfig>(argc, argv,
                                                                   "trainer");
}
