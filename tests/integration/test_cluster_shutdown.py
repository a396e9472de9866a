"""Stopping a cluster is prompt: tandem-local with its embedded defaults
(no warm start) runs for a while, gets SIGINT, and exits 0 well within the
drain deadline, every daemon saying it exited cleanly.

The launcher SIGTERMs the trainer, verifier and rollout workers together,
waits for them, then SIGTERMs the coordinator, so a stop takes about the
slowest member's stop plus the coordinator's. Nothing in this scenario
legitimately needs seconds: the trainer writes a small checkpoint, the
workers return their leases and deliver finished samples, the coordinator
syncs its journal; each takes well under 2 s on an idle machine.

STOP_BOUND_S = 8 allows about three times that on a loaded 2-core machine,
yet fails if any daemon spends its whole drain deadline (drain_timeout_ms
10000) or if a member and the coordinator each wait out an idle client's
5 s poll interval in gRPC server shutdown, which is how this used to take
about 15 s."""

import os
import re
import signal
import time
import unittest

import harness

RUN_SECONDS = 15.0
STOP_BOUND_S = 8.0
# One daemon's own stop (signal to exit): a daemon that waits out a 5 s
# client poll or half its drain deadline fails this.
DAEMON_STOP_BOUND_S = 4.0

EXITED = re.compile(r"exited cleanly \(stopped in ([0-9.]+) s\)")


class ClusterShutdownTest(unittest.TestCase):

    def test_sigint_stops_every_daemon_cleanly_within_bound(self):
        launcher = harness.Launcher(rollout_workers=2,
                                    extra_args=["--warm-start", "off"])
        try:
            launcher.wait_all_ready(timeout=120)
            started = time.monotonic()
            while time.monotonic() - started < RUN_SECONDS:
                self.assertIsNone(
                    launcher.process.poll(),
                    f"launcher exited early:\n{launcher.launcher_output()}")
                time.sleep(0.2)

            stop_start = time.monotonic()
            launcher.process.send_signal(signal.SIGINT)
            try:
                code = launcher.process.wait(timeout=60)
            except Exception:
                launcher.process.kill()
                launcher.process.wait()
                raise
            stop_seconds = time.monotonic() - stop_start

            durations = {}
            for name in launcher.names:
                log = launcher.log(name)
                match = EXITED.search(log)
                self.assertIsNotNone(
                    match, f"{name} did not exit cleanly:\n{log[-3000:]}")
                durations[name] = float(match.group(1))
            print(f"\nlauncher stopped in {stop_seconds:.2f} s; daemons: " +
                  ", ".join(f"{n} {s:.2f} s" for n, s in durations.items()),
                  flush=True)

            self.assertEqual(code, 0, launcher.launcher_output())
            self.assertLess(stop_seconds, STOP_BOUND_S,
                            f"per daemon: {durations}")
            for name, seconds in durations.items():
                self.assertLess(seconds, DAEMON_STOP_BOUND_S,
                                f"{name} took {seconds:.2f} s to stop")
        finally:
            launcher.stop()
            launcher.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
