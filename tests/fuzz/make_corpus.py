#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (corpus/<target>/) for the targets whose inputs are made by hand:
fuzz_json, fuzz_idx, fuzz_safetensors and fuzz_cli. fuzz_checkpoint's seed is its trainer's own checkpoint
head: PMAPCC_FUZZ_WRITE_SEED=corpus/fuzz_checkpoint/trained-1-epoch <fuzz_checkpoint binary>.

usage: python3 tests/fuzz/make_corpus.py   (rewrites the files it owns, leaves others alone)
"""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(dims, payload):
    return struct.pack(">I", 0x0800 | len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(payload)


def safetensors(tensors, metadata=None, pad_to=8):
    """tensors: [(name, dtype, shape, bytes)] laid out in order."""
    header, offset, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + blob


def main():
    # JSON: what checkpoints and metrics hold, and the corners of the grammar.
    config = {"backend": "cpu", "devices": 2, "members": 8, "mode": "ensemble", "epochs": 10, "batch_size": 128,
              "lr": 0.1, "momentum": 0.9, "seed": 0, "train_limit": -1, "dataset": "mnist"}
    put("fuzz_json", "config", json.dumps(config))
    put("fuzz_json", "history", json.dumps([{"epoch": 1, "train_loss": 0.2405713585156372,
                                             "member_test_accuracy": [0.9836, 0.9781], "seconds": 119.56}]))
    put("fuzz_json", "numbers", "[0,-0,-0.0,1e308,-1.5e-320,9223372036854775807,-9223372036854775808,"
                                "9223372036854775808,1E+2,0.1e-1,12345678901234567890123]")
    put("fuzz_json", "strings", '["", "a\\"b\\\\c\\/", "\\u00e9\\ud83d\\ude00", "\\b\\f\\n\\r\\t", "é😀"]')
    put("fuzz_json", "nested", '{"a":{"b":[[[],{}],null,true,false]},"c" : [ 1 , 2 ] }\n')
    put("fuzz_json", "deep", "[" * 64 + "]" * 64)

    # IDX: first byte picks raw (bit 0 clear) or compressed by the target (bit 0 set), rank 3 or 1 (bit 1).
    images = idx([2, 3, 3], range(18))
    labels = idx([5], [0, 1, 2, 9, 3])
    put("fuzz_idx", "images-raw", b"\x00" + images)
    put("fuzz_idx", "labels-raw", b"\x02" + labels)
    put("fuzz_idx", "images-compressed-by-target", b"\x01" + images)
    put("fuzz_idx", "labels-compressed-by-target", b"\x03" + labels)
    put("fuzz_idx", "images-gz-file", b"\x00" + gzip.compress(images, mtime=0))
    put("fuzz_idx", "labels-gz-file", b"\x02" + gzip.compress(labels, mtime=0))

    # safetensors: every dtype, a scalar, an empty tensor, metadata; and a pmapcc-style header.
    f32 = struct.pack("<4f", 1, -2, 0.5, 3)
    put("fuzz_safetensors", "dtypes", safetensors([
        ("a", "F32", [2, 2], f32), ("b", "F64", [1], struct.pack("<d", 2.5)), ("c", "I32", [2], struct.pack("<2i", -1, 7)),
        ("d", "I64", [], struct.pack("<q", 42)), ("e", "U32", [1], struct.pack("<I", 9)), ("f", "U8", [3], b"\x01\x02\x03"),
        ("g", "F32", [0, 4], b"")]))
    put("fuzz_safetensors", "metadata", safetensors(
        [("params/Dense_1/bias", "F32", [2, 2], f32)],
        {"format": "pmapcc.ensemble.v1", "config": json.dumps(config), "step": "10", "epochs_done": "1"}))
    put("fuzz_safetensors", "empty", safetensors([]))
    put("fuzz_safetensors", "unpadded", safetensors([("x", "U8", [2], b"ab")], pad_to=1))

    # Command lines: arguments separated by NUL bytes.
    for name, args in {
        "defaults": [],
        "training": ["--members", "8", "--devices", "2", "--epochs", "10", "--batch-size=128", "--lr", "0.1",
                     "--momentum", "0.9", "--seed", "3", "--mode", "ensemble"],
        "data-parallel": ["--mode", "data-parallel", "--devices", "4", "--train-limit", "2048", "--test-limit=1000",
                          "--report-every", "4"],
        "outputs": ["--metrics-json", "m.json", "--metrics-csv", "m.csv", "--plot", "p.svg", "--save", "c.safetensors",
                    "--resume", "r.safetensors", "--progress", "plain", "--dataset", "fashion-mnist"],
        "evaluate": ["--evaluate", "c.safetensors", "--members-subset", "0,2,5", "--predict", "p.csv", "--data", "d"],
        "backend": ["--backend", "cuda", "--kernels", "cuda-on-host"],
        "help": ["--members", "x", "--help"],
    }.items():
        put("fuzz_cli", name, "\0".join(args))


if __name__ == "__main__":
    main()
