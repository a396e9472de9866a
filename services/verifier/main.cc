#include "common/daemon/daemon_main.h"
#include "services/verifier/verifier.h"

int main(int argc, char** argv) {
  return tandem::daemon::RunDaemon<tandem::verifier::Verifier,
                                   tandem::verifier::VerifierConfig>(
      argc, argv, "verifier");
}
