// Runs an ONNX file exported by dtrain in onnxruntime (an independent runtime) on Fashion-MNIST's test images and
// compares its logits with dtrain's (dtrain_eval --logits_out: an .npz with "logits" [N, classes] and "labels").
//
//   node tests/onnxruntime/compare_logits.mjs MODEL.onnx LOGITS.npz IMAGES.idx3-ubyte.gz [--count=N]
//     [--input_mean=M --input_std=S] [--tolerance=1e-4] [--flat=1]
//
// Pixels become floats as dtrain's pipeline makes them (p * (1 / 255) in float32, then (x - mean) * (1 / std)),
// fed as [N, 1, H, W] (--flat=1: [N, H*W]).
// Prints the largest difference |ort - dtrain| / max(1, |dtrain|) and the accuracy both give; exit 1 beyond the
// tolerance, when a logit on either side is NaN or infinite (such a difference is never "within" the tolerance, and
// a later finite one cannot hide it), or when no logit was compared at all (an empty .npz, --count=0); exit 2 on
// bad arguments.
import fs from 'node:fs';
import zlib from 'node:zlib';
import ort from 'onnxruntime-node';

function fail(msg, code = 2) {
  console.error(`compare_logits: ${msg}`);
  process.exit(code);
}

const args = process.argv.slice(2).filter((a) => !a.startsWith('--'));
const opts = Object.fromEntries(process.argv.slice(2).filter((a) => a.startsWith('--')).map((a) => a.slice(2).split('=')));
if (args.length !== 3) fail('usage: compare_logits.mjs MODEL.onnx LOGITS.npz IMAGES.idx3-ubyte.gz [--count=N]');
const [modelPath, npzPath, imagesPath] = args;
const tolerance = Number(opts.tolerance ?? 1e-4);

// An .npz as dtrain writes it: a zip of STORED entries, each an NPY v1.0 float32 array.
function readNpz(path) {
  const buf = fs.readFileSync(path);
  const arrays = {};
  let at = 0;
  while (buf.readUInt32LE(at) === 0x04034b50) {
    const method = buf.readUInt16LE(at + 8);
    const size = buf.readUInt32LE(at + 18);
    const nameLen = buf.readUInt16LE(at + 26);
    const extraLen = buf.readUInt16LE(at + 28);
    const name = buf.toString('latin1', at + 30, at + 30 + nameLen).replace(/\.npy$/, '');
    const data = buf.subarray(at + 30 + nameLen + extraLen, at + 30 + nameLen + extraLen + size);
    if (method !== 0) fail(`${path}: entry ${name} is compressed`);
    const headerLen = data.readUInt16LE(8);
    const header = data.toString('latin1', 10, 10 + headerLen);
    const shape = header.match(/'shape': \(([^)]*)\)/)[1].split(',').filter((s) => s.trim()).map(Number);
    const body = data.subarray(10 + headerLen);
    arrays[name] = { shape, data: new Float32Array(body.buffer.slice(body.byteOffset, body.byteOffset + body.length)) };
    at += 30 + nameLen + extraLen + size;
  }
  return arrays;
}

function readImages(path) {
  const raw = zlib.gunzipSync(fs.readFileSync(path));
  if (raw.readUInt32BE(0) !== 2051) fail(`${path}: not an IDX image file`);
  return { count: raw.readUInt32BE(4), rows: raw.readUInt32BE(8), cols: raw.readUInt32BE(12), pixels: raw.subarray(16) };
}

const npz = readNpz(npzPath);
const want = npz.logits;
if (!want) fail(`${npzPath} holds no "logits"`);
const [total, classes] = want.shape;
const images = readImages(imagesPath);
const count = Math.min(Number(opts.count ?? total), total, images.count);
const size = images.rows * images.cols;
const mean = Math.fround(Number(opts.input_mean ?? 0));
const inv = Math.fround(1 / Math.fround(Number(opts.input_std ?? 1)));
const scale = Math.fround(1 / 255);

const session = await ort.InferenceSession.create(modelPath);
const inputName = session.inputNames[0];
const batch = 500;
let worst = 0, worstAt = -1, agree = 0, ortCorrect = 0, dtrainCorrect = 0, compared = 0;
let nonFinite = 0, firstNonFinite = -1;
for (let first = 0; first < count; first += batch) {
  const n = Math.min(batch, count - first);
  const x = new Float32Array(n * size);
  for (let i = 0; i < n * size; ++i) {
    const v = Math.fround(images.pixels[first * size + i] * scale);
    x[i] = opts.input_mean || opts.input_std ? Math.fround(Math.fround(v - mean) * inv) : v;
  }
  const flat = opts.flat === '1';
  const tensor = new ort.Tensor('float32', x, flat ? [n, size] : [n, 1, images.rows, images.cols]);
  const out = await session.run({ [inputName]: tensor });
  const got = out[session.outputNames[0]].data;
  for (let i = 0; i < n; ++i) {
    let bestGot = 0, bestWant = 0;
    for (let c = 0; c < classes; ++c) {
      const g = got[i * classes + c], w = want.data[(first + i) * classes + c];
      const d = Math.abs(g - w) / Math.max(1, Math.abs(w));
      ++compared;
      if (!Number.isFinite(g) || !Number.isFinite(w) || !Number.isFinite(d)) {
        if (nonFinite++ === 0) firstNonFinite = (first + i) * classes + c;
      } else if (d > worst) {
        worst = d;
        worstAt = (first + i) * classes + c;
      }
      if (g > got[i * classes + bestGot]) bestGot = c;
      if (w > want.data[(first + i) * classes + bestWant]) bestWant = c;
    }
    const label = npz.labels ? npz.labels.data[first + i] : -1;
    agree += bestGot === bestWant;
    ortCorrect += bestGot === label;
    dtrainCorrect += bestWant === label;
  }
}
console.log(`${modelPath}: ${count} images, largest logit difference ${worst.toExponential(2)} (relative to ` +
            `max(1, |logit|); at ${worstAt}), argmax agrees on ${agree}; accuracy onnxruntime ` +
            `${(ortCorrect / count).toFixed(4)}, dtrain ${(dtrainCorrect / count).toFixed(4)}`);
if (compared === 0) fail('no logit was compared (no images, or an empty logits array)', 1);
if (nonFinite > 0) fail(`${nonFinite} logits are NaN or infinite (the first at ${firstNonFinite})`, 1);
if (!(worst <= tolerance)) fail(`logits differ by ${worst.toExponential(2)} > ${tolerance}`, 1);
