// llama.cpp's prefill and decode speed on a GGUF file, through node-llama-cpp's prebuilt CPU
// binary (npm, installed by benchmarks/llama_cpp_bench.sh under the build tree, never committed),
// for docs/benchmarks.md beside bench_prefill --model on the same file. One JSON line per token
// count: the best of R repeats of a prefill of N token ids (BOS, then 4, 5, ... cycling below 253) and then D
// greedy decode steps, the process's resident memory after the runs, and the greedy tokens.
//
//   node llama_cpp_bench.mjs NPM_PREFIX FILE.gguf THREADS TOKENS(,TOKENS...) DECODE_STEPS REPEATS
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [prefix, file, threadsText, tokensText, decodeText, repeatsText] = process.argv.slice(2);
const threads = Number(threadsText);
const decodeSteps = Number(decodeText);
const repeats = Number(repeatsText);
const require = createRequire(path.resolve(prefix, "package.json"));
const { getLlama } = await import(require.resolve("node-llama-cpp"));

// RssAnon of /proc/self/status, and the resident bytes of this process's mappings of `file`
// (/proc/self/smaps): bench_prefill's model_memory_bytes, the same way.
function anonymousBytes() {
  const m = /^RssAnon:\s+(\d+) kB/m.exec(fs.readFileSync("/proc/self/status", "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}
function mappedFileBytes(target) {
  const real = fs.realpathSync(target);
  let inside = false;
  let total = 0;
  for (const line of fs.readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    const mapping = /^[0-9a-f]+-[0-9a-f]+ /.exec(line);
    if (mapping) {
      const slash = line.indexOf("/");
      inside = slash >= 0 && line.slice(slash) === real;
    } else if (inside && line.startsWith("Rss:")) {
      total += Number(line.split(/\s+/)[1]) * 1024;
    }
  }
  return total;
}

const rssStart = process.memoryUsage().rss;
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const rssBeforeLoad = process.memoryUsage().rss;
const anonBeforeLoad = anonymousBytes();
const model = await llama.loadModel({ modelPath: file, useMmap: true });
for (const n of tokensText.split(",").map(Number)) {
  const context = await model.createContext({
    contextSize: n + decodeSteps + 8,
    sequences: 1,
    threads,
    batchSize: Math.max(n, 32),
  });
  const prompt = [model.tokens.bos];
  for (let i = 1; i < n; ++i) prompt.push(3 + (i % 250));
  let bestPrefill = Infinity;
  let bestDecode = Infinity;
  let greedy = [];
  for (let r = 0; r < repeats + 1; ++r) {  // the first run warms up, untimed
    const sequence = context.getSequence();
    const tokens = [];
    const t0 = performance.now();
    let t1 = 0;
    for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
      if (tokens.length === 0) t1 = performance.now();
      tokens.push(token);
      if (tokens.length > decodeSteps) break;
    }
    const t2 = performance.now();
    sequence.dispose();
    if (r === 0) continue;
    bestPrefill = Math.min(bestPrefill, t1 - t0);
    bestDecode = Math.min(bestDecode, t2 - t1);
    greedy = tokens;
  }
  console.log(
    JSON.stringify({
      bench: "llama.cpp",
      engine: "node-llama-cpp@3.21.1 prebuilt CPU",
      model: file,
      file_bytes: fs.statSync(file).size,
      threads,
      tokens: n,
      prefill_ms: bestPrefill,
      prefill_tokens_per_s: n / (bestPrefill * 1e-3),
      decode_tokens_per_s: decodeSteps / (bestDecode * 1e-3),
      statistic: `best_of_${repeats}`,
      rss_process_start_bytes: rssStart,
      rss_before_load_bytes: rssBeforeLoad,
      rss_after_bytes: process.memoryUsage().rss,
      anon_grown_bytes: anonymousBytes() - anonBeforeLoad,
      file_resident_bytes: mappedFileBytes(file),
      model_memory_bytes: anonymousBytes() - anonBeforeLoad + mappedFileBytes(file),
      greedy,
    }),
  );
  await context.dispose();
}
await model.dispose();
await llama.dispose();
