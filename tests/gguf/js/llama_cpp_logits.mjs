// llama.cpp's next-token distributions (node-llama-cpp's prebuilt CPU binary) against
// promptcache's on the same GGUF file and token ids, at every position.
//
//   node llama_cpp_logits.mjs NPM_PREFIX FILE.gguf IDS OURS.f32 TOP MAX_LOGP MAX_KL
//
// IDS: the token ids as "1,2,3" (BOS included); OURS.f32: promptcache's log-softmax rows
// (tests/gguf/gguf_logits.cpp, n x vocab float32). llama.cpp evaluates the same ids in one
// batch (controlledEvaluate) and returns, at each position, the softmax of its raw logits over
// the whole vocabulary (temperature 0: the greedy sampler, which leaves the logits as they are).
// Per position: KL(llama.cpp || promptcache) over the vocabulary, and the largest difference of
// log-probabilities over the union of both engines' TOP most likely tokens. Fails (exit 1) when a
// position's KL exceeds MAX_KL, its log-probability difference exceeds MAX_LOGP, or its most
// likely token differs while the two engines do not see it as a near tie (the other's choice
// within MAX_LOGP of the best in both). Prints one JSON line with the figures per position.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [prefix, file, idsText, oursFile, topText, maxLogpText, maxKlText] = process.argv.slice(2);
const top = Number(topText), maxLogp = Number(maxLogpText), maxKl = Number(maxKlText);
const ids = idsText.split(",").map(Number);
const require = createRequire(path.resolve(prefix, "package.json"));
const { getLlama } = await import(require.resolve("node-llama-cpp"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const context = await model.createContext({ contextSize: 256, sequences: 1 });
const sequence = context.getSequence();
const results = await sequence.controlledEvaluate(
  ids.map((id) => [id, { generateNext: { probabilities: true, options: { temperature: 0 } } }])
);
const buffer = fs.readFileSync(oursFile);
const ours = new Float32Array(buffer.buffer, buffer.byteOffset, buffer.byteLength / 4);
const vocab = ours.length / ids.length;
if (!Number.isInteger(vocab)) throw new Error(`${oursFile}: not ${ids.length} rows`);

// Indices of the `k` largest values of `row`.
function topIndices(row, k) {
  const order = Array.from(row.keys());
  order.sort((a, b) => row[b] - row[a]);
  return order.slice(0, k);
}

const positions = [];
let failed = false;
for (let t = 0; t < ids.length; ++t) {
  const probabilities = results[t]?.next?.probabilities;
  if (!probabilities) throw new Error(`llama.cpp returned no probabilities at position ${t}`);
  const theirs = new Float64Array(vocab).fill(-Infinity);
  for (const [token, p] of probabilities) {
    if (token < 0 || token >= vocab) throw new Error(`llama.cpp token ${token} outside the vocabulary`);
    theirs[token] = Math.log(p);
  }
  const mine = ours.subarray(t * vocab, (t + 1) * vocab);
  let kl = 0;
  for (let v = 0; v < vocab; ++v) {
    if (theirs[v] > -Infinity) kl += Math.exp(theirs[v]) * (theirs[v] - mine[v]);
  }
  const union = new Set([...topIndices(mine, top), ...topIndices(theirs, top)]);
  let logp = 0;
  for (const v of union) {
    // A probability that underflowed to 0 in llama.cpp's f32 softmax has no finite log.
    const d = theirs[v] > -Infinity ? Math.abs(theirs[v] - mine[v]) : Infinity;
    logp = Math.max(logp, d);
  }
  const bestOurs = topIndices(mine, 1)[0], bestTheirs = topIndices(theirs, 1)[0];
  let tie = bestOurs === bestTheirs;
  if (!tie) {
    tie = mine[bestOurs] - mine[bestTheirs] <= maxLogp && theirs[bestTheirs] - theirs[bestOurs] <= maxLogp;
  }
  const ok = kl <= maxKl && logp <= maxLogp && tie;
  if (!ok) failed = true;
  positions.push({ t, kl: Number(kl.toExponential(3)), max_logp_diff: Number(logp.toExponential(3)),
                   top1: [bestOurs, bestTheirs], ok });
}
const worstKl = Math.max(...positions.map((p) => p.kl));
const worstLogp = Math.max(...positions.map((p) => p.max_logp_diff));
const sameTop1 = positions.filter((p) => p.top1[0] === p.top1[1]).length;
console.log(JSON.stringify({ file: path.basename(file), positions: positions.length, vocab, top,
                             worst_kl: worstKl, worst_max_logp_diff: worstLogp,
                             same_top1: sameTop1, max_kl: maxKl, max_logp: maxLogp,
                             ok: !failed, per_position: positions }));
await context.dispose();
await model.dispose();
await llama.dispose();
process.exit(failed ? 1 : 0);
