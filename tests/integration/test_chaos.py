"""Chaos: kill -9 a random daemon at a random moment, again and again, in a
cluster of real daemons (a coordinator with its journal, a verifier, two
rollout workers receiving weights by broadcast, a trainer checkpointing
every CHECKPOINT_EVERY versions), and check after every recovery that

- the policy version advances again within STALL_LIMIT_S of the restart
  (the stall limit of every round; the longest recovery is printed);
- no group is trained twice in the weights the trainer holds: its lineage
  (the checkpoint it resumed from, back to the first trainer, then its own
  steps) names each group once;
- every group gone from the weights by a restart is accounted for: the
  lineage holds groups_trained - groups_requeued - groups_lost groups;
- every scored or requeued group is trained, dropped as too stale, or
  still queued (groups_completed + groups_requeued = groups_trained +
  groups_dropped_stale + ready + training);
- the versions the coordinators recorded are 1, 2, 3, ..., the current
  one, each recorded as new once;
- the coordinator's counters never go backwards across its restarts.

Victims and moments: each round picks a victim (coordinator, trainer,
verifier, either rollout worker) and a moment: a random time; inside a
publish (the trainer held between its optimizer step and its publish by
TANDEM_TEST_HOLD_PUBLISH_FILE); or inside a broadcast (one rollout worker
frozen with SIGSTOP when a version is published, so that the trainer's
collective waits on it, then the kill, then SIGCONT).

Run by ctest: SHORT_ROUNDS rounds, every victim at least once. The soak
(docs/operations.md, "Chaos soak"):

  /usr/bin/python3 tests/integration/test_chaos.py --soak-minutes 30 \\
      [--net] [--seed N]

--net runs the second rollout worker on a network namespace of its own
(a node on a bridge, tests/integration/netns.py) and adds a network fault to half of the rounds, held through
the kill, the restart and the recovery (the versions must advance with
that worker slow, lossy or cut off): a slow link, packet loss, or a
partition (link down). After each round, with the fault healed, both
workers must hold the latest version within STALL_LIMIT_S. It needs root, iproute2 and nftables. TANDEM_CHAOS_SEED or --seed fixes the random choices; the
seed is printed first."""

import argparse
import collections
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import netns  # noqa: E402

HEARTBEAT_TIMEOUT_S = 1.5
# From a daemon's restart to two more published versions. A round's worst
# case: a broadcast waiting on a frozen or dead worker until the collective
# deadline (weight_sync.timeout_ms 10 s), then the heartbeat expiry, the
# re-formed group and the trainer's next step.
STALL_LIMIT_S = 45
CHECKPOINT_EVERY = 2
MAX_LAG = 8
SHORT_ROUNDS = 6
VICTIMS = ("coordinator", "trainer", "verifier", "rollout-0", "rollout-1")
MOMENTS = ("random", "publish", "broadcast")
NET_FAULTS = netns.FAULTS
RESUMED = re.compile(r"resumed from \S+: step \d+, policy version (\d+)")
PUBLISHED = re.compile(r"policy version (\d+) published by (\S+) "
                       r"\(batch (\S+), (\d+) groups\)")
PUBLISHED_AGAIN = re.compile(r"policy version (\d+) \(batch (\S+)\) "
                             r"published again by")
COUNTERS = ("groupsDispatched", "groupsCompleted", "groupsTrained",
            "groupsDroppedStale", "samplesReceived", "groupsRequeued",
            "groupsLost", "batchesReleased")
# --net: rollout-1 on a node of its own (tests/integration/netns.py); the
# other daemons on the bridge's address, in the root namespace.
NET_NODE = "rollout-1"
NET_SUBNET = "10.235.0"


steps_of = harness.steps_of


class Cluster:
    """The real daemons, restarted under new log names after each kill."""

    def __init__(self, tmp, lan=None):
        self.tmp = tmp
        self.netns = lan
        self.host = lan.host_address if lan else "127.0.0.1"
        self.port = harness.free_port()
        self.address = f"{self.host}:{self.port}"
        self.coordinator_config = os.path.join(tmp, "coordinator.yaml")
        with open(self.coordinator_config, "w") as f:
            f.write(f"""heartbeat_interval_ms: 200
heartbeat_timeout_ms: {int(HEARTBEAT_TIMEOUT_S * 1000)}
max_lag: {MAX_LAG}
training:
  batch_timeout_ms: 300000
journal:
  dir: {tmp}/journal
""")
        self.checkpoint_dir = os.path.join(tmp, "checkpoints")
        self.hold = os.path.join(tmp, "hold-publish")
        self.instances = collections.defaultdict(list)  # role -> [Daemon]
        self.daemons = []
        for role in ("coordinator", "verifier", "rollout-0", "rollout-1",
                     "trainer"):
            self.start(role)

    def current(self, role):
        return self.instances[role][-1]

    def start(self, role):
        member = ["--set", f"coordinator_address={self.address}"]
        name = f"{role}.{len(self.instances[role])}"
        kwargs = {"host": self.host}
        if role == "coordinator":
            args = ["--config", self.coordinator_config]
            kwargs["grpc_port"] = self.port
        elif role == "verifier":
            args = member
        elif role == "trainer":
            args = [*member,
                    "--set", f"checkpoint_dir={self.checkpoint_dir}",
                    "--set", f"checkpoint_every={CHECKPOINT_EVERY}",
                    "--set", "log.level=debug"]
            kwargs["env"] = {"TANDEM_TEST_HOLD_PUBLISH_FILE": self.hold}
        else:
            args = ["--config", os.path.join(
                os.path.dirname(__file__), "config", "rollout.yaml"), *member]
            if role == NET_NODE and self.netns:
                kwargs["host"] = self.netns.address(role)
                kwargs["prefix"] = self.netns.prefix(role)
        d = harness.Daemon(role.split("-")[0], self.tmp, args, name=name,
                           **kwargs)
        self.daemons.append(d)
        self.instances[role].append(d)
        d.wait_ready(timeout=60)
        return d

    def stop_all(self):
        for d in self.daemons:
            if d.process.poll() is None:
                d.process.send_signal(signal.SIGCONT)
        for d in reversed(self.daemons):
            d.stop(timeout=10)

    def status(self):
        return harness.cluster_status(self.address)

    def version(self):
        try:
            return harness.as_int(self.status(), "policyVersion")
        except (AssertionError, ValueError, subprocess.TimeoutExpired):
            return None  # the coordinator is down

    def published(self):
        """{version: batch} the coordinators recorded, and the versions
        they logged as new, in order. A coordinator killed after its
        journal record and before its log line logs the version only when
        the trainer's retry comes back as a duplicate ("published again")."""
        new, by_version = [], {}
        for d in self.instances["coordinator"]:
            log = d.output()
            for m in PUBLISHED.finditer(log):
                new.append(int(m.group(1)))
                by_version[int(m.group(1))] = m.group(3)
            for m in PUBLISHED_AGAIN.finditer(log):
                by_version.setdefault(int(m.group(1)), m.group(2))
        return by_version, new

    def lineage(self, at):
        """Group ids in the current trainer's weights at version `at`: the
        checkpoint chain back to the first trainer, then its own steps."""
        published, _ = self.published()
        trainers = [(d, d.output()) for d in self.instances["trainer"]]
        stepped = {}  # (version, batch) -> (trainer index, step index)
        for i, (_, log) in enumerate(trainers):
            for j, (v, b, _) in enumerate(steps_of(log)):
                stepped[(v, b)] = (i, j)

        def chain(i, up_to):
            log = trainers[i][1]
            steps = [s for s in steps_of(log) if s[0] <= up_to]
            groups = [g for _, _, gs in steps for g in gs]
            resumed = RESUMED.search(log)
            if not resumed or int(resumed.group(1)) == 0:
                return groups
            base = int(resumed.group(1))
            batch = published[base]
            writer, _ = stepped[(base, batch)]
            if writer == i:
                raise AssertionError(f"trainer {i} resumed from its own "
                                     f"version {base}")
            return chain(writer, base) + groups
        return chain(len(trainers) - 1, at)


class ChaosTest(unittest.TestCase):
    rounds = SHORT_ROUNDS
    minutes = 0.0
    seed = None
    use_net = False
    fixed_plan = ""

    def setUp(self):
        seed = self.seed
        if seed is None:
            seed = int(os.environ.get("TANDEM_CHAOS_SEED",
                                      str(random.randrange(1 << 30))))
        print(f"chaos seed {seed} (TANDEM_CHAOS_SEED={seed} repeats it)",
              flush=True)
        self.rng = random.Random(seed)
        self.tmp = tempfile.mkdtemp(prefix="tandem-chaos-")
        self.netns = (netns.Lan("tchaos", [NET_NODE], NET_SUBNET)
                      if self.use_net else None)
        self.cluster = None
        self.addCleanup(self.cleanup)
        self.cluster = Cluster(self.tmp, self.netns)
        self.counters = {}
        self.recoveries = []
        self.catch_up = []
        self.violations = []
        self.tally = collections.Counter()

    def cleanup(self):
        if self.cluster:
            self.cluster.stop_all()
        if self.netns:
            self.netns.teardown()
        if os.environ.get("TANDEM_KEEP_TEST_DIR"):
            print("kept", self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def wait_version(self, at_least, timeout, what):
        return harness.wait_for(
            lambda: (lambda v: v if v is not None and v >= at_least
                     else None)(self.cluster.version()),
            timeout, what, interval=0.25)

    def plan(self):
        """[(victim, moment, network fault or None)] for the whole run: the
        short run kills every victim at least once (--plan gives it)."""
        if self.fixed_plan:
            return [tuple(r.split(":") + [None])[:3] if r.count(":") == 1
                    else tuple(r.split(":"))
                    for r in self.fixed_plan.split(",")]
        victims = list(VICTIMS)
        self.rng.shuffle(victims)
        while len(victims) < self.rounds:
            victims.append(self.rng.choice(VICTIMS))
        plan = []
        for victim in victims:
            moment = self.rng.choice(MOMENTS)
            fault = (self.rng.choice(NET_FAULTS)
                     if self.netns and self.rng.random() < 0.5 else None)
            plan.append((victim, moment, fault))
        return plan

    def test_random_kills(self):
        c = self.cluster
        self.wait_version(CHECKPOINT_EVERY + 1, 120, "the first versions")
        deadline = time.monotonic() + self.minutes * 60
        plan = self.plan()
        n = 0
        while n < len(plan) or time.monotonic() < deadline:
            if n < len(plan):
                victim, moment, fault = plan[n]
            else:
                victim = self.rng.choice(VICTIMS)
                moment = self.rng.choice(MOMENTS)
                fault = (self.rng.choice(NET_FAULTS)
                         if self.netns and self.rng.random() < 0.5 else None)
            n += 1
            self.round(n, victim, moment, fault)
        worst = max(self.recoveries)
        print(f"{n} kills ({dict(self.tally)}); versions advanced again "
              f"{min(self.recoveries):.1f}-{worst:.1f} s after each "
              f"restart (limit {STALL_LIMIT_S} s); workers held the latest "
              f"version {min(self.catch_up):.1f}-{max(self.catch_up):.1f} s "
              f"later; counters {self.counters}", flush=True)
        self.assertEqual(self.violations, [],
                         "workers that did not catch up")

    def round(self, n, victim, moment, fault):
        c = self.cluster
        frozen = None
        if fault:
            self.netns.fault(NET_NODE, fault)
            time.sleep(self.rng.uniform(0.5, 3.0))
        if moment == "publish":
            if os.path.exists(c.hold + ".held"):
                os.remove(c.hold + ".held")  # left by a trainer killed holding
            open(c.hold, "w").close()
            harness.wait_for(lambda: os.path.exists(c.hold + ".held"), 60,
                             "the trainer to hold a step before its publish")
        elif moment == "broadcast":
            frozen = c.current(self.rng.choice(("rollout-0", "rollout-1")))
            before = c.version()
            frozen.process.send_signal(signal.SIGSTOP)
            if before is not None:
                try:
                    self.wait_version(before + 1, 20, "a publish")
                except AssertionError:
                    pass  # kill anyway, mid-whatever
            time.sleep(self.rng.uniform(0.0, 1.0))
        else:
            time.sleep(self.rng.uniform(0.0, 3.0))
        d = c.current(victim)
        d.process.send_signal(signal.SIGKILL)
        d.process.wait()
        d.log.close()
        if os.path.exists(c.hold):
            os.remove(c.hold)
        if frozen is not None and frozen is not d:
            frozen.process.send_signal(signal.SIGCONT)
        time.sleep(self.rng.uniform(0.0, 1.0))
        if fault and victim == NET_NODE:
            self.netns.heal(NET_NODE)  # it could not register to become ready
        c.start(victim)
        started = time.monotonic()
        self.tally[victim] += 1
        print(f"round {n}: kill -9 {victim} ({moment}"
              f"{', ' + fault if fault else ''})", flush=True)
        v = harness.wait_for(c.version, 30, "the coordinator's status",
                             interval=0.2)
        try:
            self.wait_version(v + 2, STALL_LIMIT_S,
                              f"round {n}: the policy version to advance "
                              f"after killing {victim} ({moment})")
        except AssertionError:
            for role in ("trainer", "coordinator"):
                print(f"==== {role} log (tail)\n" +
                      c.current(role).output()[-4000:])
            raise
        self.recoveries.append(time.monotonic() - started)
        if fault:
            self.netns.heal(NET_NODE)
        self.check_workers_catch_up(n, victim, moment, fault)
        self.check_invariants(n)

    def check_workers_catch_up(self, n, victim, moment, fault):
        """Both workers (the restarted one, the one behind a fault just
        healed) hold the version published now within STALL_LIMIT_S. A
        worker that does not is a violation, reported at the end (the run
        goes on: the other invariants are still checked)."""
        c = self.cluster
        target = harness.wait_for(c.version, 30, "the coordinator's status")
        started = time.monotonic()
        for role in ("rollout-0", "rollout-1"):
            address = c.current(role).wait_ready()["grpc_address"]
            try:
                harness.wait_for(
                    lambda: harness.as_int(harness.worker_status(address),
                                           "receivedPolicyVersion") >= target,
                    max(1.0, STALL_LIMIT_S - (time.monotonic() - started)),
                    f"{role} to receive version {target}", interval=0.25)
            except AssertionError as e:
                self.violations.append(
                    f"round {n} (kill -9 {victim}, {moment}"
                    f"{', ' + fault if fault else ''}): {e}")
                print(f"VIOLATION {self.violations[-1]}", flush=True)
        self.catch_up.append(time.monotonic() - started)

    def check_invariants(self, n):
        c = self.cluster
        trainer = c.current("trainer")
        trainer.process.send_signal(signal.SIGSTOP)
        try:
            status = c.status()
            at = harness.as_int(status, "policyVersion")
            lineage = c.lineage(at)
        finally:
            trainer.process.send_signal(signal.SIGCONT)
        counters = {k: harness.as_int(status["counters"], k)
                    for k in COUNTERS}
        twice = [g for g, k in collections.Counter(lineage).items() if k > 1]
        self.assertEqual(twice, [], f"round {n}: groups trained twice")
        self.assertEqual(
            len(lineage), counters["groupsTrained"] -
            counters["groupsRequeued"] - counters["groupsLost"],
            f"round {n}: the weights hold {len(lineage)} groups; "
            f"counters {counters}")
        # Every scored group (and every group requeued by a trainer's
        # restart) is trained, dropped as too stale, or still queued.
        queues = status.get("queues", {})
        queued = sum(harness.as_int(queues, q)
                     for q in ("readyGroups", "trainingGroups"))
        self.assertEqual(
            counters["groupsCompleted"] + counters["groupsRequeued"],
            counters["groupsTrained"] + counters["groupsDroppedStale"] +
            queued, f"round {n}: groups in and out; counters {counters}, "
            f"queues {queues}")
        by_version, new = c.published()
        self.assertEqual(
            [v for v, k in collections.Counter(new).items() if k > 1], [],
            f"round {n}: versions recorded as new twice")
        recorded = sorted(by_version)
        self.assertEqual(recorded, list(range(1, len(recorded) + 1)),
                         f"round {n}: versions recorded")
        self.assertGreaterEqual(len(recorded), at)
        for k, value in counters.items():
            self.assertGreaterEqual(value, self.counters.get(k, 0),
                                    f"round {n}: counter {k} went back")
        self.counters = counters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=SHORT_ROUNDS)
    parser.add_argument("--net", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--plan", default="",
                        help="rounds to run first, e.g. "
                        "trainer:random:slow,coordinator:publish")
    args, rest = parser.parse_known_args()
    ChaosTest.rounds = args.rounds
    ChaosTest.minutes = args.soak_minutes
    ChaosTest.use_net = args.net
    ChaosTest.seed = args.seed
    ChaosTest.fixed_plan = args.plan
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
