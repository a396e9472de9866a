#include "common/daemon/daemon_main.h"
#include "services/coordinator/coordinator.h"

int main(int argc, char** argv) {
  return tandem::daemon::RunDaemon<tandem::coordinator::Coordinator,
                                   tandem::coordinator::CoordinatorConfig>(
      argc, argv, "coordinator");
}
