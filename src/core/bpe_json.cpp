// src/core/bpe_json.cpp — reading the normalizer, pre-tokenizer and decoder sections of a
// tokenizer.json into the step lists of bpe_pipeline.hpp.
//
// Each step type HuggingFace writes is either read into its step (a Sequence is flattened into
// its parts, in order) or refused with an error that names the file, the field and the step types
// that are supported, so a tokenizer the encoder cannot follow never loads and encodes wrongly.
// Defaults are HuggingFace's where a field is absent.
#include "bpe_pipeline.hpp"

namespace promptcache::bpe {
namespace {

// Sequences nest, and pre_tokenize runs one step inside the previous one, so both the nesting and
// the number of steps are bounded: a hostile file cannot make either recursion deep.
constexpr int kMaxNesting = 8;

void check_depth(int depth, const std::string& field, const JsonReader& in) {
  if (depth > kMaxNesting) {
    in.fail(field, "Sequences nested more than " + std::to_string(kMaxNesting) + " deep");
  }
}

[[noreturn]] void too_many_steps(const std::string& field, const JsonReader& in) {
  in.fail(field, "more than " + std::to_string(kMaxSteps) + " steps in one section");
}

// transformers.js's PUNCTUATION_REGEX as one class: Unicode punctuation and ASCII's symbols.
const char kPunctuationClass[] =
    "[\\p{P}\\u0021-\\u002F\\u003A-\\u0040\\u005B-\\u0060\\u007B-\\u007E]";

SplitBehavior behavior_of(const std::string& name, const std::string& field, const JsonReader& in) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  in.fail(field, "unknown split behavior '" + name + "'");
}

// {"String": "..."} or {"Regex": "..."}: the literal, or the compiled regex.
void read_pattern(const json& obj, const std::string& field, const JsonReader& in,
                  std::string& literal, std::shared_ptr<JsRegex>& regex) {
  const json& p = in.require(obj, "pattern", field + ".pattern");
  if (const json* s = in.find(p, "String")) {
    literal = in.string(*s, field + ".pattern.String");
    if (literal.empty()) in.fail(field + ".pattern.String", "empty pattern");
  } else if (const json* r = in.find(p, "Regex")) {
    // The file's own pattern: \s as Oniguruma (HuggingFace's tokenizers) reads it.
    regex = std::make_shared<JsRegex>(in.string(*r, field + ".pattern.Regex"),
                                      JsRegex::WhiteSpace::kUnicode, in.file(),
                                      field + ".pattern.Regex");
  } else {
    in.fail(field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
  }
}

PrependScheme prepend_scheme(const json& obj, const std::string& field, const JsonReader& in) {
  // Older files say add_prefix_space (true = always) instead of prepend_scheme.
  if (const json* s = in.find(obj, "prepend_scheme")) {
    const std::string v = in.string(*s, field + ".prepend_scheme");
    if (v == "always") return PrependScheme::kAlways;
    if (v == "first") return PrependScheme::kFirst;
    if (v == "never") return PrependScheme::kNever;
    in.fail(field + ".prepend_scheme", "unknown prepend_scheme '" + v + "'");
  }
  return in.flag(obj, "add_prefix_space", field + ".add_prefix_space", true)
             ? PrependScheme::kAlways
             : PrependScheme::kNever;
}

}  // namespace

void read_normalizer(const json& n, const std::string& field, const JsonReader& in,
                     Pipeline& pipeline, int depth) {
  check_depth(depth, field, in);
  const std::string type = in.string(in.require(n, "type", field + ".type"), field + ".type");
  Normalizer step{Normalizer::kUnicode};
  if (type == "Sequence") {
    const json& list =
        in.array(in.require(n, "normalizers", field + ".normalizers"), field + ".normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_normalizer(list[i], field + ".normalizers[" + std::to_string(i) + "]", in, pipeline,
                      depth + 1);
    }
    return;
  } else if (type == "NFC") {
    step.form = unicode::NormalForm::kNfc;
  } else if (type == "NFD") {
    step.form = unicode::NormalForm::kNfd;
  } else if (type == "NFKC") {
    step.form = unicode::NormalForm::kNfkc;
  } else if (type == "NFKD") {
    step.form = unicode::NormalForm::kNfkd;
  } else if (type == "Replace") {
    step.kind = Normalizer::kReplace;
    read_pattern(n, field, in, step.pattern, step.regex);
    step.content = in.string(in.require(n, "content", field + ".content"), field + ".content");
  } else if (type == "Prepend") {
    step.kind = Normalizer::kPrepend;
    step.content = in.string(in.require(n, "prepend", field + ".prepend"), field + ".prepend");
    pipeline.prefixes_space = true;
  } else if (type == "Strip") {
    step.kind = Normalizer::kStrip;
    step.strip_left = in.flag(n, "strip_left", field + ".strip_left", true);
    step.strip_right = in.flag(n, "strip_right", field + ".strip_right", true);
  } else {
    in.fail(field + ".type", "normalizer '" + type +
                                 "' is not supported (supported: NFC, NFD, NFKC, NFKD, "
                                 "Replace, Prepend, Strip, Sequence)");
  }
  if (pipeline.normalizers.size() == kMaxSteps) too_many_steps(field, in);
  pipeline.normalizers.push_back(std::move(step));
}

void read_pre_tokenizer(const json& p, const std::string& field, const JsonReader& in,
                        Pipeline& pipeline, int depth) {
  check_depth(depth, field, in);
  const std::string type = in.string(in.require(p, "type", field + ".type"), field + ".type");
  if (type == "Sequence") {
    const json& list = in.array(in.require(p, "pretokenizers", field + ".pretokenizers"),
                                field + ".pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_pre_tokenizer(list[i], field + ".pretokenizers[" + std::to_string(i) + "]", in, pipeline,
                         depth + 1);
    }
    return;
  }
  PreTokenizer step{PreTokenizer::kSplit};
  if (type == "Split") {
    read_pattern(p, field, in, step.literal, step.regex);
    step.behavior =
        behavior_of(in.string(in.require(p, "behavior", field + ".behavior"), field + ".behavior"),
                    field + ".behavior", in);
    step.invert = in.flag(p, "invert", field + ".invert", false);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizer::kByteLevel;
    step.add_prefix_space = in.flag(p, "add_prefix_space", field + ".add_prefix_space", true);
    if (in.flag(p, "use_regex", field + ".use_regex", true)) {
      // GPT-2's pattern, as the JS tokenizers write it: a JS literal, so with JavaScript's \s,
      // in @huggingface/tokenizers as in transformers.js 3. HuggingFace's Rust ByteLevel
      // compiles the same pattern with Oniguruma (Unicode White_Space), which splits text with
      // U+0085 or U+FEFF differently; the reader follows the JS reference its cross-check runs
      // (docs/cli.md, "tokenize"). kUnicode here would follow the Rust one.
      step.regex = std::make_shared<JsRegex>(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
          JsRegex::WhiteSpace::kEcmaScript, in.file(), field);
    }
    if (step.add_prefix_space) pipeline.prefixes_space = true;
  } else if (type == "Punctuation") {
    // Each punctuation character is a match; behavior (HuggingFace's default Isolated) says how
    // they are cut. transformers.js knows only runs ([^P]+|[P]+), which is Contiguous.
    step.kind = PreTokenizer::kPunctuation;
    step.regex = std::make_shared<JsRegex>(kPunctuationClass, JsRegex::WhiteSpace::kEcmaScript,
                                           in.file(), field);
    step.behavior = behavior_of(in.string_or(p, "behavior", field + ".behavior", "Isolated"),
                                field + ".behavior", in);
  } else if (type == "Digits") {
    // transformers.js: [^\d]+|\d+ (or \d alone with individual_digits); JS's \d is ASCII, so
    // the step cuts at ASCII digits (bpe_pre_tokenize.cpp finds them without a regex).
    step.kind = PreTokenizer::kDigits;
    step.behavior = in.flag(p, "individual_digits", field + ".individual_digits", false)
                        ? SplitBehavior::kIsolated
                        : SplitBehavior::kContiguous;
  } else if (type == "Metaspace") {
    step.kind = PreTokenizer::kMetaspace;
    step.replacement = in.string_or(p, "replacement", field + ".replacement", "\xE2\x96\x81");
    if (step.replacement.empty()) in.fail(field + ".replacement", "empty replacement");
    step.prepend = prepend_scheme(p, field, in);
    step.split = in.flag(p, "split", field + ".split", true);
    if (step.prepend != PrependScheme::kNever) pipeline.prefixes_space = true;
  } else {
    in.fail(field + ".type", "pre-tokenizer '" + type +
                                 "' is not supported (supported: Split, ByteLevel, Metaspace, "
                                 "Punctuation, Digits, Sequence)");
  }
  if (pipeline.pre.size() == kMaxSteps) too_many_steps(field, in);
  pipeline.pre.push_back(std::move(step));
}

void read_decoder(const json& d, const std::string& field, const JsonReader& in, Pipeline& pipeline,
                  int depth) {
  check_depth(depth, field, in);
  const std::string type = in.string(in.require(d, "type", field + ".type"), field + ".type");
  if (type == "Sequence") {
    const json& list =
        in.array(in.require(d, "decoders", field + ".decoders"), field + ".decoders");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_decoder(list[i], field + ".decoders[" + std::to_string(i) + "]", in, pipeline,
                   depth + 1);
    }
    return;
  }
  Decoder step{Decoder::kByteLevel};
  if (type == "ByteLevel") {
  } else if (type == "Metaspace") {
    step.kind = Decoder::kMetaspace;
    step.pattern = in.string_or(d, "replacement", field + ".replacement", "\xE2\x96\x81");
    step.strip_first = prepend_scheme(d, field, in) != PrependScheme::kNever;
  } else if (type == "ByteFallback") {
    step.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Decoder::kFuse;
  } else if (type == "Strip") {
    step.kind = Decoder::kStrip;
    step.content = in.string(in.require(d, "content", field + ".content"), field + ".content");
    step.start =
        static_cast<int>(in.integer(in.require(d, "start", field + ".start"), field + ".start"));
    step.stop =
        static_cast<int>(in.integer(in.require(d, "stop", field + ".stop"), field + ".stop"));
  } else if (type == "Replace") {
    step.kind = Decoder::kReplace;
    read_pattern(d, field, in, step.pattern, step.regex);
    step.content = in.string(in.require(d, "content", field + ".content"), field + ".content");
  } else {
    in.fail(field + ".type", "decoder '" + type +
                                 "' is not supported (supported: ByteLevel, Metaspace, "
                                 "ByteFallback, Fuse, Strip, Replace, Sequence)");
  }
  if (pipeline.decoders.size() == kMaxSteps) too_many_steps(field, in);
  pipeline.decoders.push_back(std::move(step));
}

}  // namespace promptcache::bpe
