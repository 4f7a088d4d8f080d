// Our SentencePiece reader/encoder against libsentencepiece itself, token for token.
#include <sentencepiece_processor.h>
#include "support/catch.hpp"

#include <fstream>
#include <sstream>

#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

std::vector<std::string> sample_texts() {
  std::vector<std::string> texts = {
      "Once upon a time",
      "Once upon a time, there was a little girl named Lily.",
      "  leading spaces and   inner  runs  ",
      "trailing space ",
      "new\nlines\n\nand\ttabs",
      "quotes \"like this\" and 'that'",
      "digits 1234567890 and 3.14159",
      "accents: café, naïve, Ærøskøbing",
      "CJK 日本語のテキスト and emoji 🙂🚀",
      "[INST] <<SYS>> You are helpful. <</SYS>> Hi [/INST]",
      "",
      " ",
      "a",
      "x" + std::string(300, 'y'),
  };
  std::istringstream corpus(builtin_corpus());
  std::string line;
  while (std::getline(corpus, line)) texts.push_back(line);
  return texts;
}

void cross_check(const std::string& model_path) {
  sentencepiece::SentencePieceProcessor reference;
  REQUIRE(reference.Load(model_path).ok());
  const auto ours = load_sentencepiece_tokenizer(model_path);
  REQUIRE(ours->vocab_size() == static_cast<std::size_t>(reference.GetPieceSize()));
  CHECK(ours->bos_id() == reference.bos_id());
  CHECK(ours->eos_id() == reference.eos_id());
  CHECK(ours->unk_id() == reference.unk_id());
  for (const auto& text : sample_texts()) {
    std::vector<int> expected;
    REQUIRE(reference.Encode(text, &expected).ok());
    const auto got = ours->encode(text);
    INFO("text: '" << text << "'");
    CHECK(std::vector<int>(got.begin(), got.end()) == expected);
    std::string expected_text;
    REQUIRE(reference.Decode(expected, &expected_text).ok());
    CHECK(ours->decode(got) == expected_text);
  }
  for (int id = 0; id < reference.GetPieceSize(); ++id) {
    CHECK(ours->id_to_piece(id) == reference.IdToPiece(id));
    CHECK(ours->piece_to_id(reference.IdToPiece(id)) == id);
  }
  CHECK(ours->piece_to_id("no such piece at all") == -1);
}

}  // namespace

TEST_CASE("encoder matches libsentencepiece on stories260K's tokenizer", "[tokenizer]") {
  cross_check(test::checked_stories260k_dir() + "/tokenizer.model");
  const auto tok = load_sentencepiece_tokenizer(test::stories260k_dir() + "/tokenizer.model");
  CHECK(tok->encode("Once upon a time", true) == std::vector<TokenId>{1, 403, 407, 261, 378});
}

TEST_CASE("a tokenizer trained on the built-in corpus matches libsentencepiece", "[tokenizer]") {
  test::TempDir dir;
  train_sentencepiece_tokenizer(builtin_corpus(), 400, dir.file("t.model"));
  cross_check(dir.file("t.model"));
  const auto tok = load_sentencepiece_tokenizer(dir.file("t.model"));
  CHECK(tok->vocab_size() <= 400);
  CHECK(tok->decode(tok->encode("Once upon a time, Lily saw a ball.")) ==
        "Once upon a time, Lily saw a ball.");
}

TEST_CASE("broken tokenizer files give clear errors", "[tokenizer]") {
  test::TempDir dir;
  CHECK_THROWS_WITH(load_sentencepiece_tokenizer(dir.file("missing.model")),
                    Catch::Contains("missing.model"));
  {
    std::ofstream f(dir.file("junk.model"), std::ios::binary);
    f << "\x0a\xff\xff\xff\xff\x0f garbage";
  }
  try {
    load_sentencepiece_tokenizer(dir.file("junk.model"));
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kTokenizer);
    CHECK_THAT(e.what(), Catch::Contains("junk.model"));
  }
}
