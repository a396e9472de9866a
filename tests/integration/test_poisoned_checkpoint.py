"""A checkpoint whose tensor data is garbage is refused where it is loaded,
naming the file and the tensor, instead of computing with NaN: random bytes
over one tensor of a `model.safetensors` written by `tandemctl export`
make `tandemctl logprobs` exit non-zero with an error that names
model.safetensors and the tensor (it printed NaN log-probs and exited 0
before), and make a trainer started on that directory exit at start-up
with the same error."""

import json
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

TENSOR = "model.embed_tokens.weight"
INPUT = '{"tokens": [1, 2, 3, 4, 5]}\n'


def overwrite_with_random_bytes(path, name, seed=7):
    """Random bytes over tensor `name`'s data; the header stays valid."""
    with open(path, "r+b") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        begin, end = header[name]["data_offsets"]
        rng = random.Random(seed)
        f.seek(8 + header_size + begin)
        f.write(bytes(rng.getrandbits(8) for _ in range(end - begin)))


def logprobs(model_dir):
    return subprocess.run(
        [harness.binary("tandemctl"), "logprobs", "--model", model_dir],
        input=INPUT, capture_output=True, text=True, timeout=120)


def main():
    with tempfile.TemporaryDirectory(prefix="tandem-poison-") as tmp:
        model_dir = os.path.join(tmp, "model")
        out = subprocess.run(
            [harness.binary("tandemctl"), "export", "--output", model_dir],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        good = logprobs(model_dir)
        assert good.returncode == 0, good.stderr
        assert "nan" not in good.stdout.lower(), good.stdout

        weights_file = os.path.join(model_dir, "model.safetensors")
        overwrite_with_random_bytes(weights_file, TENSOR)
        bad = logprobs(model_dir)
        print("tandemctl logprobs on random bytes:", bad.returncode,
              bad.stderr.strip())
        assert bad.returncode != 0, (bad.stdout, bad.stderr)
        assert "nan" not in bad.stdout.lower(), bad.stdout
        assert weights_file in bad.stderr, bad.stderr
        assert f"'{TENSOR}'" in bad.stderr, bad.stderr
        assert "non-finite" in bad.stderr, bad.stderr

        # The trainer refuses the same directory as its initial policy.
        trainer = harness.Daemon(
            "trainer", tmp,
            extra=["--set", f"model.path={model_dir}",
                   "--set", f"checkpoint_dir={os.path.join(tmp, 'ckpt')}"])
        try:
            code = trainer.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            trainer.stop()
            raise AssertionError(
                "the trainer started on a poisoned checkpoint:\n" +
                trainer.output())
        log = trainer.output()
        trainer.stop()
        print("trainer exit", code, log.strip().splitlines()[-1:])
        assert code != 0, log
        assert weights_file in log and f"'{TENSOR}'" in log, log
    print("ok")


if __name__ == "__main__":
    main()
