"""Exits 0 when two mnist_ensemble --metrics-json files hold the same results, timings aside (the run's
seconds and rates differ run to run; every accuracy, loss and calibration figure must be equal)."""
import json
import sys

TIMINGS = {"seconds", "eval_seconds", "model_images_per_second"}


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


a, b = (strip(json.load(open(path))) for path in sys.argv[1:3])
if a != b:
    sys.exit(f"{sys.argv[1]} and {sys.argv[2]} differ beyond their timings")
