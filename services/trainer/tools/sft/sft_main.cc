// Standalone `tandem-sft` until `tandem-trainer sft` dispatches to
// RunSftCommand.
#include "services/trainer/tools/sft/sft_command.h"

int main(int argc, char** argv) {
  return tandem::trainer::sft::RunSftCommand(argc, argv);
}
