#!/usr/bin/env python3
"""Writes a tiny MNIST-shaped IDX dataset (learnable: the label is drawn as a bright block) for CLI tests.

usage: make_idx.py DIR [train_count test_count [label_noise [side]]]

label_noise: the fraction of labels replaced by a random class (the images keep their block), so that
accuracies stay below 100% and differences between runs show. side: the images' height and width (28).
"""
import os, random, struct, sys

def write(path, magic, dims, payload):
    with open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)

def images_and_labels(n, rng, noise=0.0, side=28):
    imgs, labels = bytearray(), bytearray()
    for _ in range(n):
        label = rng.randrange(10)
        img = bytearray(rng.randrange(64) for _ in range(side * side))
        # the block: 8x4 at rows 0/14, columns 0, 5, ..., 20 on 28x28 images, scaled for other sides
        r0, c0 = (label // 5) * (side // 2), (label % 5) * max(1, side * 5 // 28)
        for r in range(r0, r0 + max(1, side * 8 // 28)):
            for c in range(c0, c0 + max(1, side * 4 // 28)):
                img[r * side + c] = 255
        imgs += img
        labels.append(rng.randrange(10) if noise > 0 and rng.random() < noise else label)
    return bytes(imgs), bytes(labels)

def main():
    out = sys.argv[1]
    ntrain = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    ntest = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    noise = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    side = int(sys.argv[5]) if len(sys.argv) > 5 else 28
    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    for prefix, n in (("train", ntrain), ("t10k", ntest)):
        imgs, labels = images_and_labels(n, rng, noise, side)
        write(os.path.join(out, prefix + "-images-idx3-ubyte"), 0x803, (n, side, side), imgs)
        write(os.path.join(out, prefix + "-labels-idx1-ubyte"), 0x801, (n,), labels)

main()
