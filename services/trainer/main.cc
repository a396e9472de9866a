#include "common/daemon/daemon_main.h"
#include "services/trainer/trainer.h"

int main(int argc, char** argv) {
  return tandem::daemon::RunDaemon<tandem::trainer::Trainer,
                                   tandem::trainer::TrainerConfig>(argc, argv,
                                                                   "trainer");
}
