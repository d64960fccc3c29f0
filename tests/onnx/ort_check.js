// Runs an exported pmapcc model in ONNX Runtime (npm's onnxruntime-node) on MNIST test images and compares it
// with pmapcc's own predictions (mnist_ensemble --predict): for every image the same class, and the same
// top probability and predictive entropy within the tolerance.
//   node ort_check.js MODEL.onnx MNIST_DIR PREDICT.csv [TOLERANCE]
// MODEL: an ensemble export (outputs probabilities, class) or a member export (logits, probabilities),
// checked against the --predict CSV of that ensemble or of that member alone. Prints the largest
// differences and the class agreement; exits 1 when a check fails, 2 on bad input.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

function die(code, message) {
  console.error('ort_check.js: ' + message);
  process.exit(code);
}

const [modelPath, dataDir, predictPath, tolText] = process.argv.slice(2);
if (!predictPath) die(2, 'usage: node ort_check.js MODEL.onnx MNIST_DIR PREDICT.csv [TOLERANCE]');
const tolerance = tolText === undefined ? 1e-5 : Number(tolText);
const ortDir = process.env.PMAPCC_ORT_NODE;
let ort;
try {
  ort = require(ortDir ? ortDir : 'onnxruntime-node');
} catch (e) {
  die(2, 'cannot load onnxruntime-node (' + (ortDir || 'from the module path') + '): ' + e.message);
}

// The test images, raw or gzip'd IDX: (count, 28, 28) u8.
function readImages(dir) {
  for (const name of ['t10k-images-idx3-ubyte', 't10k-images-idx3-ubyte.gz']) {
    const file = path.join(dir, name);
    if (!fs.existsSync(file)) continue;
    let bytes = fs.readFileSync(file);
    if (name.endsWith('.gz')) bytes = zlib.gunzipSync(bytes);
    if (bytes.readUInt32BE(0) !== 0x803) die(2, file + ': not an IDX image file');
    const count = bytes.readUInt32BE(4), rows = bytes.readUInt32BE(8), cols = bytes.readUInt32BE(12);
    return {count, rows, cols, pixels: bytes.subarray(16)};
  }
  die(2, dir + ': no t10k-images-idx3-ubyte[.gz]');
}

function readPredictions(file) {
  const lines = fs.readFileSync(file, 'utf8').trim().split('\n');
  const head = lines[0].split(',');
  const col = (name) => {
    const i = head.indexOf(name);
    if (i < 0) die(2, file + ': no column ' + name);
    return i;
  };
  const [ci, cp, cprob, cent] = [col('index'), col('prediction'), col('probability'), col('entropy')];
  return lines.slice(1).map((l) => {
    const f = l.split(',');
    return {index: Number(f[ci]), prediction: Number(f[cp]), probability: Number(f[cprob]), entropy: Number(f[cent])};
  });
}

async function main() {
  const images = readImages(dataDir);
  const rows = readPredictions(predictPath);
  const session = await ort.InferenceSession.create(modelPath);
  const classes = 10, pixels = images.rows * images.cols, batch = 1000;
  let maxProb = 0, maxEntropy = 0, same = 0;
  for (let begin = 0; begin < rows.length; begin += batch) {
    const piece = rows.slice(begin, begin + batch);
    const x = new Float32Array(piece.length * pixels);
    piece.forEach((r, i) => {
      if (!(r.index >= 0 && r.index < images.count)) die(2, predictPath + ': image index ' + r.index + ' out of range');
      for (let p = 0; p < pixels; ++p) x[i * pixels + p] = images.pixels[r.index * pixels + p] / 255;
    });
    const out = await session.run({images: new ort.Tensor('float32', x, [piece.length, images.rows, images.cols, 1])});
    const probs = out.probabilities.data;
    piece.forEach((r, i) => {
      let best = 0, entropy = 0;
      for (let k = 0; k < classes; ++k) {
        const p = probs[i * classes + k];
        if (p > probs[i * classes + best]) best = k;
        if (p > 0) entropy -= p * Math.log(p);
      }
      if (out.class !== undefined && Number(out.class.data[i]) !== best) die(1, 'class output disagrees with argmax');
      if (best === r.prediction) ++same;
      maxProb = Math.max(maxProb, Math.abs(probs[i * classes + best] - r.probability));
      maxEntropy = Math.max(maxEntropy, Math.abs(entropy - r.entropy));
    });
  }
  console.log(`${path.basename(modelPath)}: ${rows.length} images, class agreement ${same}/${rows.length}, ` +
              `max |probability diff| ${maxProb.toExponential(2)}, max |entropy diff| ${maxEntropy.toExponential(2)}`);
  if (same !== rows.length || !(maxProb <= tolerance) || !(maxEntropy <= 10 * tolerance)) process.exit(1);
}

main().catch((e) => die(1, e.message));
