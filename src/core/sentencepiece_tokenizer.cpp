// A self-contained reader for SentencePiece models (tokenizer.model) with BPE encoding, byte
// fallback and decoding — no libsentencepiece at run time.
//
// Why not libsentencepiece: Debian's build bundles protobuf-lite 3.14 and exports its symbols,
// while LibTorch loads the system protobuf 3.21; in one process the two collide during static
// initialisation and crash. Reading the ModelProto ourselves avoids that, and the test suite
// checks this encoder token-for-token against libsentencepiece in a process without LibTorch.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <queue>
#include <random>
#include <sstream>
#include <unordered_map>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "sentencepiece_data.hpp"

namespace promptcache {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's whitespace marker

// --- minimal protobuf wire-format reader -----------------------------------------------------
class ProtoReader {
 public:
  ProtoReader(const char* data, std::size_t size, const std::string& origin)
      : p_(data), end_(data + size), origin_(origin) {}
  bool done() const { return p_ >= end_; }
  // Reads a field key; returns {field number, wire type}.
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t k = varint();
    return {static_cast<uint32_t>(k >> 3), static_cast<uint32_t>(k & 7)};
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) fail();
      const uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail();
  }
  float fixed32_float() {
    if (end_ - p_ < 4) fail();
    float f;
    std::memcpy(&f, p_, 4);  // little-endian on every platform LibTorch supports
    p_ += 4;
    return f;
  }
  ProtoReader sub() {
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_)) fail();
    ProtoReader r(p_, n, origin_);
    p_ += n;
    return r;
  }
  std::string bytes() {
    ProtoReader r = sub();
    return std::string(r.p_, r.end_);
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0:
        varint();
        break;
      case 1:
        advance(8);
        break;
      case 2:
        sub();
        break;
      case 5:
        advance(4);
        break;
      default:
        fail();
    }
  }

 private:
  void advance(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) fail();
    p_ += n;
  }
  [[noreturn]] void fail() const {
    throw Error(ErrorKind::kTokenizer, "not a valid SentencePiece model (truncated or corrupt)",
                {origin_});
  }
  const char* p_;
  const char* end_;
  std::string origin_;
};

enum PieceType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct Piece {
  std::string text;
  float score = 0;
  int type = kNormal;
  int byte = -1;  // kByte: the byte it stands for (checked at load)
};

// The byte of a byte piece "<0xHH>", or -1 when the text is not of that form.
int byte_of_piece(const std::string& text) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;  // invalid lead byte: a symbol of its own
}

// Appends decoded bytes, replacing each invalid UTF-8 sequence with U+FFFD as SentencePiece does.
void append_utf8_checked(const std::string& bytes, std::string& out) {
  for (std::size_t i = 0; i < bytes.size();) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    std::size_t n = utf8_length(c);
    bool ok = (c < 0x80 || n > 1) && i + n <= bytes.size();
    for (std::size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    }
    if (ok) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
}

}  // namespace

namespace detail {

SentencePieceData parse_sentencepiece_model(const std::string& bytes, const std::string& origin) {
  SentencePieceData d;
  ProtoReader model(bytes.data(), bytes.size(), origin);
  while (!model.done()) {
    const auto [field, wire] = model.key();
    if (field == 1 && wire == 2) {
      ProtoReader pr = model.sub();
      SentencePieceData::Piece piece;
      while (!pr.done()) {
        const auto [f, w] = pr.key();
        if (f == 1 && w == 2)
          piece.text = pr.bytes();
        else if (f == 2 && w == 5)
          piece.score = pr.fixed32_float();
        else if (f == 3 && w == 0)
          piece.type = static_cast<int>(pr.varint());
        else
          pr.skip(w);
      }
      d.pieces.push_back(std::move(piece));
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      ProtoReader tr = model.sub();
      while (!tr.done()) {
        const auto [f, w] = tr.key();
        if (f == 3 && w == 0)
          d.model_type = static_cast<int>(tr.varint());
        else if (f == 35 && w == 0)
          d.byte_fallback = tr.varint() != 0;
        else if (f == 40 && w == 0)
          d.unk_id = static_cast<int32_t>(tr.varint());
        else if (f == 41 && w == 0)
          d.bos_id = static_cast<int32_t>(tr.varint());
        else if (f == 42 && w == 0)
          d.eos_id = static_cast<int32_t>(tr.varint());
        else if (f == 43 && w == 0)
          d.pad_id = static_cast<int32_t>(tr.varint());
        else
          tr.skip(w);
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      ProtoReader nr = model.sub();
      while (!nr.done()) {
        const auto [f, w] = nr.key();
        if (f == 1 && w == 2)
          d.normalizer_name = nr.bytes();
        else if (f == 2 && w == 2)
          d.charmap = nr.bytes();
        else if (f == 3 && w == 0)
          d.add_dummy_prefix = nr.varint() != 0;
        else if (f == 4 && w == 0)
          d.remove_extra_whitespaces = nr.varint() != 0;
        else if (f == 5 && w == 0)
          d.escape_whitespaces = nr.varint() != 0;
        else
          nr.skip(w);
      }
    } else {
      model.skip(wire);
    }
  }
  return d;
}

}  // namespace detail

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& bytes, const std::string& origin)
      : SentencePieceTokenizer(detail::parse_sentencepiece_model(bytes, origin), origin) {}
  SentencePieceTokenizer(detail::SentencePieceData d, const std::string& origin)
      : byte_fallback_(d.byte_fallback),
        add_dummy_prefix_(d.add_dummy_prefix),
        remove_extra_whitespaces_(d.remove_extra_whitespaces),
        escape_whitespaces_(d.escape_whitespaces),
        normalizer_name_(d.normalizer_name),
        unk_id_(d.unk_id),
        bos_id_(d.bos_id),
        eos_id_(d.eos_id),
        pad_id_(d.pad_id) {
    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    const int model_type = d.model_type;
    const std::string& charmap = d.charmap;
    for (auto& p : d.pieces) {
      Piece piece;
      piece.text = std::move(p.text);
      piece.score = p.score;
      piece.type = p.type;
      pieces_.push_back(std::move(piece));
    }
    if (pieces_.empty()) {
      throw Error(ErrorKind::kTokenizer, "SentencePiece model has no pieces", {origin});
    }
    if (model_type != 2) {
      throw Error(ErrorKind::kTokenizer,
                  "only BPE SentencePiece models are supported (Llama-family tokenizers); this "
                  "one has model_type " +
                      std::to_string(model_type),
                  {origin});
    }
    if (!charmap.empty()) {
      throw Error(ErrorKind::kTokenizer,
                  "SentencePiece normalizer '" + normalizer_name_ +
                      "' is not supported (only the identity normalizer of Llama-family "
                      "tokenizers is)",
                  {origin});
    }
    // Int32 fields arrive as varints of the two's complement; -1 ids come back as huge values.
    for (int32_t* id : {&unk_id_, &bos_id_, &eos_id_, &pad_id_}) {
      if (*id < 0 || *id >= static_cast<int32_t>(pieces_.size())) *id = -1;
    }
    // encode() gives unk for text no piece spells, so a model must have one: without it encode()
    // returned -1 ids, which the model's embedding cannot take (found by fuzzing). As
    // SentencePiece does, the unk is the UNKNOWN piece when the trainer spec names none;
    // a model with neither is refused ("unk is not defined" in SentencePiece).
    if (unk_id_ < 0) {
      for (std::size_t i = 0; i < pieces_.size() && unk_id_ < 0; ++i) {
        if (pieces_[i].type == kUnknown) unk_id_ = static_cast<int32_t>(i);
      }
      if (unk_id_ < 0) {
        throw Error(ErrorKind::kTokenizer, "SentencePiece model defines no unk piece", {origin});
      }
    }
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      Piece& p = pieces_[i];
      // A byte piece must read "<0xHH>": the text used to go to std::stoi unchecked, so a
      // corrupt model threw std::invalid_argument, and "<0x-1>" wrote byte_ids_[-1] (found by
      // fuzzing).
      if (p.type == kByte) {
        p.byte = byte_of_piece(p.text);
        if (p.byte < 0) {
          throw Error(
              ErrorKind::kTokenizer,
              "SentencePiece byte piece " + std::to_string(i) + " is not of the form <0xHH>",
              {origin});
        }
      }
      all_.emplace(p.text, static_cast<TokenId>(i));
      if (p.type == kNormal || p.type == kUserDefined || p.type == kUnused) {
        mergeable_.emplace(p.text, static_cast<TokenId>(i));
      }
      if (p.type == kUserDefined) user_defined_.push_back(p.text);
      if (p.type == kByte) byte_ids_[p.byte] = static_cast<TokenId>(i);
    }
    // Longest first, so prefix matching takes the longest user-defined symbol.
    std::sort(user_defined_.begin(), user_defined_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  }

  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    const std::string normalized = normalize(text);
    if (normalized.empty()) return out;
    encode_bpe(normalized, out);
    return out;
  }

  std::string decode(const std::vector<TokenId>& ids) const override {
    std::string out, bytes;
    bool at_start = true;
    auto flush_bytes = [&]() {
      if (bytes.empty()) return;
      append_utf8_checked(bytes, out);
      bytes.clear();
      at_start = false;
    };
    for (TokenId id : ids) {
      if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) continue;
      const Piece& p = pieces_[id];
      if (p.type == kControl) continue;
      if (p.type == kByte) {
        bytes += static_cast<char>(p.byte);
        continue;
      }
      flush_bytes();
      std::string surface = p.type == kUnknown ? " \xE2\x81\x87 " : unescape(p.text);
      if (at_start && add_dummy_prefix_ && p.type != kUnknown && !surface.empty() &&
          surface[0] == ' ') {
        surface.erase(0, 1);
      }
      at_start = false;  // only the very first piece carries the dummy prefix
      out += surface;
    }
    flush_bytes();
    return out;
  }

  std::string decode_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    const Piece& p = pieces_[id];
    if (p.type == kControl) return "";
    if (p.type == kByte) return std::string(1, static_cast<char>(p.byte));
    if (p.type == kUnknown) return " \xE2\x81\x87 ";
    return unescape(p.text);
  }

  TokenId bos_id() const override { return bos_id_; }
  TokenId eos_id() const override { return eos_id_; }
  TokenId unk_id() const override { return unk_id_; }
  TokenId pad_id() const override { return pad_id_; }
  std::size_t vocab_size() const override { return pieces_.size(); }
  TokenId piece_to_id(std::string_view piece) const override {
    auto it = all_.find(std::string(piece));
    return it == all_.end() ? -1 : it->second;
  }
  std::string id_to_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    return pieces_[id].text;
  }

 private:
  std::string unescape(const std::string& piece) const {
    std::string out;
    for (std::size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

  // SentencePiece's normalizer with an identity rule: optional removal of extra spaces, the
  // dummy-prefix space, and spaces written as U+2581.
  std::string normalize(std::string_view text) const {
    std::string s(text);
    if (remove_extra_whitespaces_) {
      std::string collapsed;
      bool previous_space = true;  // drops leading spaces
      for (char c : s) {
        if (c == ' ') {
          if (!previous_space) collapsed += ' ';
          previous_space = true;
        } else {
          collapsed += c;
          previous_space = false;
        }
      }
      while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
      s = collapsed;
    }
    if (s.empty()) return s;
    if (add_dummy_prefix_) s.insert(s.begin(), ' ');
    if (!escape_whitespaces_) return s;
    std::string out;
    out.reserve(s.size() * 2);
    for (char c : s) {
      if (c == ' ')
        out += kSpace;
      else
        out += c;
    }
    return out;
  }

  // BPE as SentencePiece does it: start from characters (and user-defined symbols), repeatedly
  // merge the adjacent pair whose concatenation is the highest-scoring piece (leftmost on ties).
  void encode_bpe(const std::string& text, std::vector<TokenId>& out) const {
    struct Symbol {
      int prev, next;
      std::size_t begin, size;
    };
    std::vector<Symbol> symbols;
    for (std::size_t i = 0; i < text.size();) {
      std::size_t n = 0;
      for (const auto& u : user_defined_) {
        if (text.compare(i, u.size(), u) == 0) {
          n = u.size();
          break;
        }
      }
      if (n == 0) n = std::min(utf8_length(static_cast<unsigned char>(text[i])), text.size() - i);
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({index - 1, index + 1, i, n});
      i += n;
    }
    symbols.back().next = -1;
    struct Candidate {
      float score;
      int left, right;
      std::size_t size;  // merged byte length, to detect stale entries
    };
    auto worse = [](const Candidate& a, const Candidate& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> agenda(worse);
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const std::size_t size = symbols[left].size + symbols[right].size;
      auto it = mergeable_.find(text.substr(symbols[left].begin, size));
      if (it == mergeable_.end()) return;
      agenda.push({pieces_[it->second].score, left, right, size});
    };
    for (std::size_t i = 1; i < symbols.size(); ++i)
      consider(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!agenda.empty()) {
      const Candidate c = agenda.top();
      agenda.pop();
      Symbol& left = symbols[c.left];
      if (left.size == 0 || left.next != c.right || symbols[c.right].size == 0 ||
          left.size + symbols[c.right].size != c.size) {
        continue;  // one side was merged away since this candidate was queued
      }
      Symbol& right = symbols[c.right];
      left.size += right.size;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      right.size = 0;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }
    for (int i = 0; i >= 0 && i < static_cast<int>(symbols.size()); i = symbols[i].next) {
      const std::string piece = text.substr(symbols[i].begin, symbols[i].size);
      auto it = all_.find(piece);
      if (it != all_.end() && pieces_[it->second].type != kUnused) {
        out.push_back(it->second);
      } else if (byte_fallback_) {
        for (unsigned char b : piece) out.push_back(byte_ids_[b] >= 0 ? byte_ids_[b] : unk_id_);
      } else {
        out.push_back(unk_id_);
      }
    }
  }

  std::vector<Piece> pieces_;
  std::unordered_map<std::string, TokenId> all_;        // every piece
  std::unordered_map<std::string, TokenId> mergeable_;  // normal, user-defined, unused
  std::vector<std::string> user_defined_;
  TokenId byte_ids_[256] = {};
  bool byte_fallback_ = false;
  bool add_dummy_prefix_ = true;
  bool remove_extra_whitespaces_ = true;
  bool escape_whitespaces_ = true;
  std::string normalizer_name_;
  int32_t unk_id_ = 0, bos_id_ = 1, eos_id_ = 2, pad_id_ = -1;
};

std::string read_file(const std::string& path, ErrorKind kind, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(kind, "cannot open " + what, {path});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer_from_bytes(const std::string& bytes,
                                                                   const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(bytes, origin);
}

namespace detail {

std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_data(SentencePieceData data,
                                                             const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(std::move(data), origin);
}

}  // namespace detail

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path) {
  return load_sentencepiece_tokenizer_from_bytes(
      read_file(model_path, ErrorKind::kIo, "tokenizer model"), model_path);
}

void train_sentencepiece_tokenizer(const std::string& corpus_text, int vocab_size,
                                   const std::string& out_model_path) {
  // Training runs Debian's spm_train in a child process (see the file comment for why the
  // library is not linked). The identity normalizer keeps the model readable by our encoder.
  namespace fs = std::filesystem;
  const fs::path out(out_model_path);
  std::random_device rd;
  const fs::path work =
      fs::temp_directory_path() /
      ("promptcache-spm-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  fs::create_directories(work);
  const fs::path corpus = work / "corpus.txt";
  {
    std::ofstream c(corpus);
    c << corpus_text;
  }
  const fs::path prefix = work / "m";
  std::vector<std::string> args = {"spm_train",
                                   "--input=" + corpus.string(),
                                   "--model_prefix=" + prefix.string(),
                                   "--model_type=bpe",
                                   "--vocab_size=" + std::to_string(vocab_size),
                                   "--byte_fallback=true",
                                   "--unk_id=0",
                                   "--bos_id=1",
                                   "--eos_id=2",
                                   "--pad_id=-1",
                                   "--character_coverage=1.0",
                                   "--split_digits=true",
                                   "--normalization_rule_name=identity",
                                   "--remove_extra_whitespaces=false",
                                   "--hard_vocab_limit=false",
                                   "--num_threads=1",
                                   "--minloglevel=2"};
  const fs::path log = work / "spm_train.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execvp("spm_train", argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) < 0) {
    fs::remove_all(work);
    throw Error(ErrorKind::kTokenizer, "could not start spm_train", {out_model_path});
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code != 0) {
    std::string detail =
        code == 127 ? "spm_train was not found (install Debian's 'sentencepiece' "
                      "package: scripts/install-deps.sh)"
                    : "spm_train failed: " + read_file(log.string(), ErrorKind::kIo, "log");
    fs::remove_all(work);
    throw Error(ErrorKind::kTokenizer, detail, {out_model_path});
  }
  std::error_code ec;
  fs::copy_file(prefix.string() + ".model", out, fs::copy_options::overwrite_existing, ec);
  fs::remove_all(work);
  if (ec)
    throw Error(ErrorKind::kIo, "cannot write tokenizer model: " + ec.message(), {out_model_path});
}

}  // namespace promptcache
