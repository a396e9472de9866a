"""Independent reference for the tree digest (common/weights/tree_digest.h),
written from its definition with Python's hashlib, for the C++ tests.

    tree_digest_reference.py tree|sha256 FILE...

prints one lower-case hex digest per FILE: its tree root, or (sha256) its
plain SHA-256.
"""
import hashlib
import sys

LEAF = 4096
FANOUT = 128


def tree_root(data: bytes) -> bytes:
    n = len(data)
    # n == 0: one empty leaf.
    level = [hashlib.sha256(data[i:i + LEAF] + b"\x00").digest()
             for i in range(0, max(n, 1), LEAF)]
    while len(level) > 1:
        level = [hashlib.sha256(b"".join(level[i:i + FANOUT]) + b"\x01").digest()
                 for i in range(0, len(level), FANOUT)]
    return hashlib.sha256(level[0] + n.to_bytes(8, "little") +
                          LEAF.to_bytes(4, "little") +
                          FANOUT.to_bytes(4, "little") + b"\x02").digest()


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("tree", "sha256"):
        print(__doc__, file=sys.stderr)
        return 2
    for path in sys.argv[2:]:
        with open(path, "rb") as f:
            data = f.read()
        digest = tree_root(data) if sys.argv[1] == "tree" else hashlib.sha256(data).digest()
        print(digest.hex())
    return 0


if __name__ == "__main__":
    sys.exit(main())
