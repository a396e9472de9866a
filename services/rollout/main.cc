#include "common/daemon/daemon_main.h"
#include "services/rollout/rollout_worker.h"

int main(int argc, char** argv) {
  return tandem::daemon::RunDaemon<tandem::rollout::RolloutWorker,
                                   tandem::rollout::RolloutConfig>(argc, argv,
                                                                   "rollout");
}
