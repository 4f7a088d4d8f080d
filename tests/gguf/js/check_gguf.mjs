// Reads a GGUF file written by `promptcache convert` with @huggingface/gguf (an independent
// parser) and checks it against the folder's config.json and convert's --json report: the
// architecture and hyper-parameters, and every tensor's name, shape and ggml type.
//
//   node check_gguf.mjs NPM_PREFIX FILE.gguf CONFIG.json REPORT.json
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";

const [prefix, file, configPath, reportPath] = process.argv.slice(2);
const require = createRequire(path.resolve(prefix, "package.json"));
const { gguf } = await import(require.resolve("@huggingface/gguf"));

const config = JSON.parse(readFileSync(configPath, "utf8"));
const report = JSON.parse(readFileSync(reportPath, "utf8"));
const { metadata, tensorInfos } = await gguf(file, { allowLocalFile: true });

let failures = 0;
const expect = (what, got, want) => {
  if (got !== want) {
    console.log(`${file}: ${what}: got ${got}, want ${want}`);
    failures++;
  }
};
const archOf = { llama: "llama", mistral: "llama", qwen2: "qwen2", qwen3: "qwen3" };
const arch = archOf[config.model_type];
expect("general.architecture", metadata["general.architecture"], arch);
expect("version", metadata.version, 3);
expect("block_count", Number(metadata[`${arch}.block_count`]), config.num_hidden_layers);
expect("embedding_length", Number(metadata[`${arch}.embedding_length`]), config.hidden_size);
expect("feed_forward_length", Number(metadata[`${arch}.feed_forward_length`]),
       config.intermediate_size);
expect("attention.head_count", Number(metadata[`${arch}.attention.head_count`]),
       config.num_attention_heads);
expect("attention.head_count_kv", Number(metadata[`${arch}.attention.head_count_kv`]),
       config.num_key_value_heads ?? config.num_attention_heads);
expect("context_length", Number(metadata[`${arch}.context_length`]),
       config.max_position_embeddings);
const theta = metadata[`${arch}.rope.freq_base`];
expect("rope.freq_base", Math.abs(theta - (config.rope_theta ?? 10000)) < 1e-3 * theta, true);
expect("tokenizer tokens", Array.isArray(metadata["tokenizer.ggml.tokens"]), true);
expect("tensor count", tensorInfos.length, report.tensors.length);
const byName = new Map(tensorInfos.map((t) => [t.name, t]));
const ggmlType = { F32: 0, F16: 1, Q4_0: 2, Q5_0: 6, Q5_1: 7, Q8_0: 8, Q4_K: 12, Q5_K: 13, Q6_K: 14,
                   BF16: 30 };
for (const t of report.tensors) {
  const info = byName.get(t.name);
  if (!info) {
    console.log(`${file}: tensor ${t.name} is missing`);
    failures++;
    continue;
  }
  expect(`${t.name} shape`, info.shape.map(Number).join(","), [...t.shape].reverse().join(","));
  expect(`${t.name} type`, info.dtype, ggmlType[t.type]);
}
console.log(`${path.basename(file)}: ${arch}, ${tensorInfos.length} tensors, ` +
            `${Object.keys(metadata).length} keys: ${failures} mismatches`);
process.exit(failures ? 1 : 0);
