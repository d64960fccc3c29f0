#!/usr/bin/env python3
"""Compares two pmapcc checkpoints tensor by tensor, bit for bit (standard library only).

  python3 scripts/compare_checkpoints.py OLD.safetensors NEW.safetensors

Version 1 checkpoints name SGD's momentum "momentum/<tensor>"; version 2 "opt/momentum/<tensor>": the two
are matched. Prints each tensor as 'same' or the count of differing elements and the largest difference,
then the step and the members; exits 0 when every tensor of both files is bitwise the same, 1 otherwise,
2 for a file that cannot be read.
"""
import json
import struct
import sys


def read(path):
    try:
        with open(path, "rb") as f:
            n, = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            data = f.read()
    except (OSError, ValueError, struct.error) as e:
        sys.exit(f"compare_checkpoints.py: {path}: {e}")
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        start, end = t["data_offsets"]
        if name.startswith("momentum/"):
            name = "opt/" + name
        tensors[name] = data[start:end]
    return meta, tensors


def main():
    if len(sys.argv) != 3:
        print("usage: compare_checkpoints.py OLD.safetensors NEW.safetensors", file=sys.stderr)
        return 2
    (meta_a, a), (meta_b, b) = read(sys.argv[1]), read(sys.argv[2])
    same = True
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'the first' if name in a else 'the second'} file")
            same = False
            continue
        if a[name] == b[name]:
            print(f"{name}: same")
            continue
        same = False
        va = struct.unpack(f"<{len(a[name]) // 4}f", a[name])
        vb = struct.unpack(f"<{len(b[name]) // 4}f", b[name]) if len(b[name]) == len(a[name]) else ()
        if not vb:
            print(f"{name}: different sizes")
            continue
        diff = [abs(x - y) for x, y in zip(va, vb) if x != y]
        print(f"{name}: {len(diff)} of {len(va)} elements differ, largest by {max(diff):.3g}")
    for key in ("step", "epochs_done"):
        if meta_a.get(key) != meta_b.get(key):
            print(f"__metadata__.{key}: {meta_a.get(key)} vs {meta_b.get(key)}")
            same = False
    print("bitwise the same" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
