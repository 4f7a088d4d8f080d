// Loads a GGUF file written by `promptcache convert` in llama.cpp (node-llama-cpp's prebuilt
// binary, CPU only) and prints, as one JSON line, the ids it tokenizes a text to (no BOS) and
// its 20 greedy tokens after BOS + that text: check_llama_cpp.sh compares them with promptcache's.
//
//   node llama_cpp_check.mjs NPM_PREFIX FILE.gguf TEXT
import { createRequire } from "node:module";
import path from "node:path";

const [prefix, file, text] = process.argv.slice(2);
const require = createRequire(path.resolve(prefix, "package.json"));
const { getLlama } = await import(require.resolve("node-llama-cpp"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const ids = Array.from(model.tokenize(text, false));
const context = await model.createContext({ contextSize: 128, sequences: 1 });
const sequence = context.getSequence();
const prompt = [model.tokens.bos, ...ids];
const greedy = [];
for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
  greedy.push(token);
  if (greedy.length >= 20) break;
}
console.log(JSON.stringify({ ids, bos: model.tokens.bos, greedy }));
await context.dispose();
await model.dispose();
await llama.dispose();
