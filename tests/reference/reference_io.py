"""What the tests/reference cross-checks share: reading IDX and safetensors files, running mnist_ensemble, and
comparing its final test accuracies with the reference's. Needs NumPy (the callers check for it first)."""
import json, struct, subprocess, sys

import numpy as np


def read_idx(path):
    with open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


DTYPES = {"F32": "<f4", "I64": "<i8", "I32": "<i4"}  # what pmapcc's checkpoints hold (a step count is I64)


def read_safetensors(path):
    """The tensors by name (F32, I64 or I32), and the __metadata__ strings."""
    with open(path, "rb") as f:
        n, = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        assert e["dtype"] in DTYPES, f"{path}: {name} is {e['dtype']}"
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(blob[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"]).copy()
    return out, meta


def run(program, cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{program}: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")


def compare_loss(epoch, mine, theirs, failures):
    """Prints one epoch's training loss beside the reference's; a failure past 1e-3 relative."""
    rel = abs(mine - theirs) / abs(theirs)
    print(f"{epoch:5d} {mine:12.6f} {theirs:12.6f} {rel:9.1e}")
    if rel > 1e-3:
        failures.append(f"epoch {epoch}: training loss {mine:.6f} (pmapcc) vs {theirs:.6f} (torch)")


def compare_accuracies(last_epoch, member, ensemble, test_count, failures):
    """Prints pmapcc's final member and ensemble test accuracies beside the reference's and adds a failure for
    each that differs by more than an example or two on the decision boundary."""
    print("member test accuracy:", [round(v, 4) for v in last_epoch["member_test_accuracy"]], "(pmapcc)",
          [round(v, 4) for v in member], "(torch)")
    print(f"ensemble test accuracy: {last_epoch['ensemble_test_accuracy']:.4f} (pmapcc) {ensemble:.4f} (torch)")
    tol = 2.0 / test_count + 1e-12
    for m, (mine, theirs) in enumerate(zip(last_epoch["member_test_accuracy"], member)):
        if abs(mine - theirs) > tol:
            failures.append(f"member {m}: test accuracy {mine:.4f} (pmapcc) vs {theirs:.4f} (torch)")
    if abs(last_epoch["ensemble_test_accuracy"] - ensemble) > tol:
        failures.append(f"ensemble test accuracy {last_epoch['ensemble_test_accuracy']:.4f} vs {ensemble:.4f}")
