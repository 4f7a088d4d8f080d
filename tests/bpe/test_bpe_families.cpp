// tokenizer.json pipelines of the BLOOM, GPT-NeoX (MPT) and Falcon families: the Punctuation and
// Digits pre-tokenizers, a ByteLevel step that hands later steps byte characters, BLOOM's split
// class, the BOS guess under a ByteLevel post-processor, the limits on hostile pipelines, and
// train_bpe_tokenizer under each family's pipeline. The JS cross-check
// (tests/tokenizer/js/crosscheck.sh) compares whole files against the JS tokenizers; these cases
// pin each piece on strings small enough to reason about.
#include "support/catch.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include "gpt2_bytes.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;
using json = nlohmann::json;

namespace {

using test::byte_char;

// The byte characters of a UTF-8 string ("Ġ" for a space).
std::string chars_of(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += byte_char(b);
  return out;
}

json byte_level_step(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

// A byte-level tokenizer.json: the 256 byte characters (id = byte), then `merges` (in byte
// characters) in rank order, with the given pre-tokenizer.
json tokenizer_json(const json& pre_tokenizer,
                    const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_list.push_back(json::array({a, b}));
  }
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", byte_level_step(true)},
          {"model",
           {{"type", "BPE"}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", merge_list}}}};
}

json sequence(const json& steps) {
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

std::unique_ptr<Tokenizer> load(const test::TempDir& dir, const json& j,
                                const std::string& name = "tokenizer.json") {
  std::ofstream(dir.file(name), std::ios::binary) << j.dump();
  return load_bpe_tokenizer(dir.file(name));
}

// The vocabulary strings of the ids `text` encodes to.
std::vector<std::string> pieces(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> out;
  for (TokenId id : tok.encode(text)) out.push_back(tok.id_to_piece(id));
  return out;
}

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an Error");
  throw std::logic_error("unreachable");
}

const char* kBloomRegex =
    " ?[^(\\s|[.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C])]"
    "+";

json falcon_pre_tokenizer() {
  return sequence(json::array({{{"type", "Punctuation"}, {"behavior", "Contiguous"}},
                               byte_level_step(true),
                               {{"type", "Digits"}, {"individual_digits", false}},
                               {{"type", "Split"},
                                {"pattern", {{"Regex", "[0-9][0-9][0-9]"}}},
                                {"behavior", "Isolated"},
                                {"invert", false}}}));
}

}  // namespace

TEST_CASE("Digits cuts runs of ASCII digits or single ones", "[bpe][families]") {
  test::TempDir dir;
  const std::string arabic_three = chars_of("\xD9\xA3");  // U+0663, a digit to \p{N} only
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "1"},         {"1", "2"}, {"12", "3"}, {"3", "x"}, {byte_char(0xD9), byte_char(0xA3)},
      {arabic_three, "4"}};
  auto digits = [&](bool individual) {
    return sequence(json::array(
        {{{"type", "Digits"}, {"individual_digits", individual}}, byte_level_step(false)}));
  };
  const auto runs = load(dir, tokenizer_json(digits(false), merges), "runs.json");
  CHECK(pieces(*runs, "a123x") == std::vector<std::string>{"a", "123", "x"});
  // transformers.js's \d is ASCII: U+0663 stays with the text around it, not with the 4.
  CHECK(pieces(*runs,
               "\xD9\xA3"
               "4") == std::vector<std::string>{arabic_three, "4"});
  CHECK(runs->decode(runs->encode("a123x \xD9\xA3"
                                  "4")) ==
        "a123x \xD9\xA3"
        "4");

  const auto single = load(dir, tokenizer_json(digits(true), merges), "single.json");
  CHECK(pieces(*single, "a123x") == std::vector<std::string>{"a", "1", "2", "3", "x"});

  // Without the step the merges cross the digits: the cases above are not vacuous.
  const auto none = load(dir, tokenizer_json(byte_level_step(false), merges), "none.json");
  CHECK(pieces(*none, "a123x") == std::vector<std::string>{"a1", "2", "3x"});
}

TEST_CASE("Punctuation cuts as its behavior says", "[bpe][families]") {
  test::TempDir dir;
  const std::string stop = "\xE3\x80\x82";  // U+3002, Po
  const std::string e3_80 = byte_char(0xE3) + byte_char(0x80);
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "!"},
      {"!", "!"},
      {"!!", "?"},
      {"x", "$"},
      {"$", "y"},
      {byte_char(0xE3), byte_char(0x80)},
      {e3_80, byte_char(0x82)},
      {"b", chars_of(stop)}};
  auto punctuation = [&](const char* behavior) {
    json step = {{"type", "Punctuation"}};
    if (behavior) step["behavior"] = behavior;
    return sequence(json::array({step, byte_level_step(false)}));
  };
  const auto contiguous = load(dir, tokenizer_json(punctuation("Contiguous"), merges), "c.json");
  CHECK(pieces(*contiguous, "a!!?b") == std::vector<std::string>{"a", "!!?", "b"});
  // ASCII symbols count (transformers.js's class), and so does CJK punctuation.
  CHECK(pieces(*contiguous, "x$y") == std::vector<std::string>{"x", "$", "y"});
  CHECK(pieces(*contiguous, "b" + stop) == std::vector<std::string>{"b", chars_of(stop)});

  const auto isolated = load(dir, tokenizer_json(punctuation("Isolated"), merges), "i.json");
  CHECK(pieces(*isolated, "a!!?b") == std::vector<std::string>{"a", "!", "!", "?", "b"});
  const auto fallback = load(dir, tokenizer_json(punctuation(nullptr), merges), "d.json");
  CHECK(pieces(*fallback, "a!!?b") == pieces(*isolated, "a!!?b"));  // HuggingFace's default
  const auto removed = load(dir, tokenizer_json(punctuation("Removed"), merges), "r.json");
  CHECK(pieces(*removed, "a!!?b") == std::vector<std::string>{"a", "b"});

  const auto none = load(dir, tokenizer_json(byte_level_step(false), merges), "n.json");
  CHECK(pieces(*none, "a!!?b") == std::vector<std::string>{"a!", "!", "?", "b"});
  CHECK(pieces(*none, "b" + stop) == std::vector<std::string>{"b" + chars_of(stop)});
}

TEST_CASE("a ByteLevel step before Digits and Split hands them byte characters",
          "[bpe][families]") {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"3", "4"},  {"1", "2"}, {"12", "3"}, {"4", "5"},
      {"45", "6"}, {"Ġ", "1"}, {"6", "7"},  {"Ð", "¼"}};
  const auto falcon = load(dir, tokenizer_json(falcon_pre_tokenizer(), merges));
  CHECK(pieces(*falcon, "x 1234567") == std::vector<std::string>{"x", "Ġ", "123", "456", "7"});
  // "м" is D0 BC, byte characters "Ð¼"; "¼" is \p{N} but not JS's \d, so it stays whole
  // (HuggingFace's Rust Digits, which takes every numeric character, would cut it off).
  CHECK(pieces(*falcon, "\xD0\xBC") == std::vector<std::string>{"Ð¼"});
  for (const std::string text : {"x 1234567", "\xD0\xBC\xD0\xB8\xD1\x80 999, ok!", "a\xFF\xFE b",
                                 "(555) 123-4567 ext. 89", ""}) {
    CHECK(falcon->decode(falcon->encode(text)) ==
          (text == "a\xFF\xFE b" ? "a\xEF\xBF\xBD\xEF\xBF\xBD b" : text));
  }
  // The same merges without the steps after ByteLevel: the digits merge across the groups.
  const auto plain = load(dir, tokenizer_json(byte_level_step(true), merges), "plain.json");
  CHECK(pieces(*plain, "x 1234567") == std::vector<std::string>{"x", "Ġ", "12", "34", "5", "67"});
}

TEST_CASE("pre-tokens after a ByteLevel step look tokens up as byte characters do",
          "[bpe][families]") {
  // Behind cutting steps the merge loop takes the pre-token's bytes again; its first lookups must
  // stay those of the byte characters, added tokens included (transformers.js maps them too):
  // here "Ġ" is no model token, only an added one, and a space still encodes to it.
  test::TempDir dir;
  json j = tokenizer_json(falcon_pre_tokenizer(), {{"1", "2"}});
  j["model"]["vocab"].erase(byte_char(' '));
  j["added_tokens"] = json::array(
      {{{"id", 300}, {"content", byte_char(' ')}, {"special", false}, {"normalized", false}}});
  const auto falcon = load(dir, j);
  CHECK(falcon->encode("a 12") == std::vector<TokenId>{'a', 300, falcon->piece_to_id("12")});

  // A step that may add a character standing for no byte (Metaspace's "▁") keeps the pre-tokens
  // as characters: "▁" is looked up as itself.
  json m = tokenizer_json(sequence(json::array({byte_level_step(false),
                                                {{"type", "Metaspace"},
                                                 {"replacement", "\xE2\x96\x81"},
                                                 {"prepend_scheme", "always"},
                                                 {"split", false}}})),
                          {{"\xE2\x96\x81", "a"}});
  m["model"]["vocab"]["\xE2\x96\x81"] = 301;
  m["model"]["vocab"]
   ["\xE2\x96\x81"
    "a"] = 302;
  m["model"]["merges"] = json::array({json::array({"\xE2\x96\x81", "a"})});
  const auto meta = load(dir, m, "metaspace.json");
  CHECK(meta->encode("ab") == std::vector<TokenId>{302, 'b'});
}

TEST_CASE("the BLOOM split class keeps parentheses and the pipe out of words", "[bpe][families]") {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "("}, {"(", "b"}, {"a", "|"}, {"a", byte_char(0xC2)}, {"a", byte_char(0xEF)}};
  json j = tokenizer_json(sequence(json::array({{{"type", "Split"},
                                                 {"pattern", {{"Regex", kBloomRegex}}},
                                                 {"behavior", "Isolated"},
                                                 {"invert", false}},
                                                byte_level_step(false)})),
                          merges);
  const auto bloom = load(dir, j);
  CHECK(pieces(*bloom, "a(b") == std::vector<std::string>{"a", "(", "b"});
  CHECK(pieces(*bloom, "a|b").front() == "a");
  // Oniguruma's \s is Unicode White_Space: U+0085 splits, U+FEFF does not.
  CHECK(pieces(*bloom,
               "a\xC2\x85"
               "b")
            .front() == "a");
  CHECK(pieces(*bloom,
               "a\xEF\xBB\xBF"
               "b")
            .front() == "a" + byte_char(0xEF));

  // <s> with a ByteLevel post-processor: no BOS (BLOOM); without a post-processor: BOS.
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 301}, {"content", "</s>"}, {"special", true}}});
  const auto without = load(dir, j, "nopost.json");
  CHECK(without->bos_id() == 300);
  CHECK(without->adds_bos());
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  const auto with = load(dir, j, "post.json");
  CHECK(with->bos_id() == 300);
  CHECK_FALSE(with->adds_bos());
  CHECK(with->eos_id() == 301);
  // A template in a Sequence still decides (Llama 3.1's shape).
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}})}};
  CHECK(load(dir, j, "template.json")->adds_bos());
}

TEST_CASE(
    "a tokenizer.json regex reads its white-space class as Oniguruma and ByteLevel's own regex as "
    "JavaScript",
    "[bpe][families]") {
  // Llama 3's split regex (Qwen2's differs only in \p{N}): HuggingFace's tokenizers and
  // @huggingface/tokenizers read its \s as Unicode White_Space, U+0085 in and U+FEFF out.
  const char* llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string nel = "\xC2\x85", bom = "\xEF\xBB\xBF";
  // Merges that join U+0085 with a following "!" and " " U+FEFF "!" into one token each, so a
  // split between them shows as separate tokens.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {byte_char(0xC2), byte_char(0x85)}, {chars_of(nel), "!"},
      {byte_char(0xEF), byte_char(0xBB)}, {chars_of("\xEF\xBB"), byte_char(0xBF)},
      {byte_char(' '), chars_of(bom)},    {chars_of(" " + bom), "!"}};
  const std::string text = "x" + nel + "! a " + bom + "!";
  test::TempDir dir;

  const auto split = load(dir,
                          tokenizer_json(sequence(json::array({{{"type", "Split"},
                                                                {"pattern", {{"Regex", llama3}}},
                                                                {"behavior", "Isolated"},
                                                                {"invert", false}},
                                                               byte_level_step(false)})),
                                         merges),
                          "split.json");
  // U+0085 is white space: "!" is cut off it. U+FEFF is not: " " U+FEFF "!" is one pre-token.
  CHECK(pieces(*split, text) == std::vector<std::string>{"x", chars_of(nel), "!", byte_char(' '),
                                                         "a", chars_of(" " + bom + "!")});
  CHECK(split->decode(split->encode(text)) == text);

  // ByteLevel's GPT-2 regex is a JS literal in both JS tokenizers: JavaScript's \s, the other
  // way round (U+0085 joins the "!", U+FEFF is white space between " " and "!").
  const auto byte_level = load(dir, tokenizer_json(byte_level_step(true), merges), "bl.json");
  CHECK(pieces(*byte_level, text) == std::vector<std::string>{"x", chars_of(nel + "!"),
                                                              byte_char(' '), "a", byte_char(' '),
                                                              chars_of(bom), "!"});

  // A Replace normalizer's regex is the file's own too: Oniguruma's \s.
  json replace = tokenizer_json(byte_level_step(false), {});
  replace["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s"}}}, {"content", "_"}};
  const auto normalized = load(dir, replace, "replace.json");
  CHECK(normalized->decode(normalized->encode("a" + nel + "b" + bom + "c d")) ==
        "a_b" + bom + "c_d");
}

TEST_CASE("hostile pipelines are refused with the field named", "[bpe][families]") {
  test::TempDir dir;
  // Sequences nested far deeper than any real file: an error, not a deep recursion. (Written as
  // text: building the nesting as a json value copies it at every level.)
  std::string text = tokenizer_json("@PRE@", {}).dump();
  std::string nested;
  for (int i = 0; i < 10000; ++i) nested += R"({"type": "Sequence", "pretokenizers": [)";
  nested += byte_level_step(false).dump();
  for (int i = 0; i < 10000; ++i) nested += "]}";
  text.replace(text.find("\"@PRE@\""), 7, nested);
  std::ofstream(dir.file("deep.json"), std::ios::binary) << text;
  Error e = error_of([&] { load_bpe_tokenizer(dir.file("deep.json")); });
  CHECK_THAT(e.what(), Catch::Contains("deep.json") && Catch::Contains("nested"));
  json nine = byte_level_step(false);
  for (int i = 0; i < 8; ++i) nine = sequence(json::array({nine}));
  CHECK_NOTHROW(load(dir, tokenizer_json(nine, {}), "eight.json"));

  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back({{"type", "Digits"}});
  e = error_of([&] { load(dir, tokenizer_json(sequence(many), {}), "many.json"); });
  CHECK_THAT(e.what(), Catch::Contains("more than 64 steps") &&
                           Catch::Contains("pre_tokenizer.pretokenizers[64]"));

  e = error_of([&] {
    load(dir,
         tokenizer_json(sequence(json::array({byte_level_step(true), byte_level_step(false)})), {}),
         "two.json");
  });
  CHECK_THAT(e.what(), Catch::Contains("more than one ByteLevel"));

  e = error_of([&] {
    load(dir, tokenizer_json({{"type", "Punctuation"}, {"behavior", "Sideways"}}, {}), "p.json");
  });
  CHECK_THAT(e.what(), Catch::Contains("pre_tokenizer.behavior") && Catch::Contains("Sideways"));
  e = error_of([&] {
    load(dir, tokenizer_json({{"type", "Digits"}, {"individual_digits", "yes"}}, {}), "d.json");
  });
  CHECK_THAT(e.what(), Catch::Contains("pre_tokenizer.individual_digits"));
  e = error_of([&] { load(dir, tokenizer_json({{"type", "WhitespaceSplit"}}, {}), "w.json"); });
  CHECK_THAT(e.what(), Catch::Contains("WhitespaceSplit") && Catch::Contains("Punctuation") &&
                           Catch::Contains("Digits"));
}

TEST_CASE("the Falcon pipeline on hostile text: long digit and punctuation runs",
          "[bpe][families]") {
  test::TempDir dir;
  const auto falcon = load(dir, tokenizer_json(falcon_pre_tokenizer(), {{"1", "2"}, {"12", "3"}}));
  const std::string digits(100000, '1');
  const auto ids = falcon->encode(digits);
  CHECK(ids.size() == 100000);  // groups of three, no merge for "111"
  CHECK(falcon->decode(ids) == digits);
  std::string mixed;
  for (int i = 0; i < 20000; ++i) mixed += i % 3 ? "!?" : "9\xD0\xBC(";
  CHECK(falcon->decode(falcon->encode(mixed)) == mixed);
}

TEST_CASE("train_bpe_tokenizer under the family pipelines", "[bpe][families]") {
  test::TempDir dir;
  std::string text = builtin_corpus();
  for (int i = 0; i < 50; ++i)
    text += "f(x) = a|b, 1234567 and (12345) more; \xD0\xBC\xD0\xB8\xD1\x80.\n";
  for (const char* name : {"qwen2", "bloom", "gpt-neox", "mpt", "falcon"}) {
    INFO(name);
    const std::string path = dir.file(std::string(name) + ".json");
    train_bpe_tokenizer(text, 1200, {"<|endoftext|>"}, path, bpe_family_from_name(name));
    const auto tok = load_bpe_tokenizer(path);
    const std::string probe = "f(x) = a|b, 1234567 \xD0\xBC\xD0\xB8\xD1\x80.";
    const std::string nfc = probe;  // ASCII and Cyrillic: NFC leaves it as it is
    CHECK(tok->decode(tok->encode(probe)) == nfc);
    json j;
    std::ifstream(path) >> j;
    const std::string family = name;
    // Merges never cross a boundary the family's pre-tokenizer keeps.
    for (const auto& item : j["model"]["vocab"].items()) {
      const std::string& piece = item.key();
      const bool alnum = std::any_of(piece.begin(), piece.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c));
      });
      INFO(piece);
      if (family == "bloom")
        CHECK_FALSE((alnum && piece.find_first_of("()|") != std::string::npos));
      if (family == "falcon") CHECK(piece.find("1234") == std::string::npos);
    }
    if (family == "falcon") {
      CHECK(j["pre_tokenizer"]["pretokenizers"][0]["type"] == "Punctuation");
      CHECK(tok->piece_to_id("123") >= 0);  // groups of three are learned
    }
    if (family == "gpt-neox" || family == "mpt") {
      CHECK(j["normalizer"]["type"] == "NFC");
      CHECK(tok->piece_to_id(std::string(24, ' ')) >= 0);  // plain added token
      CHECK(tok->encode("a" + std::string(24, ' ') + "b").size() == 3);
    }
  }
  Error e = error_of([] { bpe_family_from_name("gpt-5"); });
  CHECK(e.kind() == ErrorKind::kInvalidArgument);
  CHECK_THAT(e.what(), Catch::Contains("gpt-5") && Catch::Contains("falcon"));
}
