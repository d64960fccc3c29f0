// Runs networks tests/test_onnx_export.cpp exported (the "zoo": every primitive with an ONNX emitter in one
// network; a residual network; a network with nn::LayerNorm) in ONNX Runtime (npm's onnxruntime-node) on the images pmapcc evaluated, and
// compares the logits with pmapcc's: each within TOLERANCE * (1 + |pmapcc's|). Each runs on all its images at
// once and on the first 2 (the graph takes any number of examples; the 2 are compared too where the network
// computes each example alone, "per_example"). Prints the largest difference; exits 1 when a check fails, 2 on
// bad input.
//   node ort_zoo.js DIR NAME... [--tolerance T]      (DIR holds NAME.onnx and NAME.json)
'use strict';
const fs = require('fs');
const path = require('path');

function die(code, message) {
  console.error('ort_zoo.js: ' + message);
  process.exit(code);
}

const args = process.argv.slice(2);
let tolerance = 1e-5;
const t = args.indexOf('--tolerance');
if (t >= 0) tolerance = Number(args.splice(t, 2)[1]);
const [dir, ...names] = args;
if (!dir || names.length === 0) die(2, 'usage: node ort_zoo.js DIR NAME... [--tolerance T]');
let ort;
try {
  ort = require(process.env.PMAPCC_ORT_NODE || 'onnxruntime-node');
} catch (e) {
  die(2, 'cannot load onnxruntime-node: ' + e.message);
}

async function check(name) {
  let want;
  try {
    want = JSON.parse(fs.readFileSync(path.join(dir, name + '.json'), 'utf8'));
  } catch (e) {
    die(2, path.join(dir, name + '.json') + ': ' + e.message);
  }
  const session = await ort.InferenceSession.create(path.join(dir, name + '.onnx'));
  const shape = want.shape, perImage = shape.slice(1).reduce((a, b) => a * b, 1);
  const classes = want.logits.length / shape[0];
  let worst = 0;
  for (const n of [shape[0], 2]) {
    const x = Float32Array.from(want.images.slice(0, n * perImage));
    const out = await session.run({images: new ort.Tensor('float32', x, [n].concat(shape.slice(1)))});
    const got = out.logits.data;
    if (got.length !== n * classes) die(1, `${name}: ${n} images gave ${got.length} logits, not ${n * classes}`);
    // The zoo centres over the examples (mean_rows, sum_rows): its 2-image run checks shapes and finiteness.
    for (let i = 0; i < got.length; ++i) {
      if (!Number.isFinite(got[i])) die(1, `${name}: logit ${i} of ${n} images is ${got[i]}`);
      if (n !== shape[0] && !want.per_example) continue;
      const w = want.logits[i], d = Math.abs(got[i] - w) / (1 + Math.abs(w));
      worst = Math.max(worst, d);
    }
  }
  console.log(`${name}.onnx: ${want.logits.length} logits, max |difference| / (1 + |pmapcc's|) ` +
              worst.toExponential(2));
  return worst <= tolerance;
}

async function main() {
  let ok = true;
  for (const name of names) ok = (await check(name)) && ok;
  if (!ok) process.exit(1);
}

main().catch((e) => die(1, e.message));
