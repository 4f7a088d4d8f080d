// Module src files are read only through the resolver the parser is handed (src_files.hpp):
// decided on the parsed attribute, never on the text; every way out of the root is refused.
#include <sys/stat.h>

#include <fstream>

#include "promptcache/pml/schema.hpp"
#include "support/catch.hpp"
#include "support/test_support.hpp"

using namespace promptcache;
using namespace promptcache::pml;
namespace fs = std::filesystem;

namespace {

const std::string kCanary = "CANARY-outside-the-root-7f3a";

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// root/ holds inside.txt and sub/deep.txt; outside/ beside it holds the canary; root/ also holds
// links leading out (a file link and a folder link) and one staying in.
struct Tree {
  test::TempDir dir{"promptcache-src"};
  fs::path root = dir.path() / "root";
  fs::path outside = dir.path() / "outside";
  Tree() {
    write(root / "inside.txt", "inside text");
    write(root / "sub" / "deep.txt", "deep text");
    write(outside / "canary.txt", kCanary);
    fs::create_symlink(outside / "canary.txt", root / "link-out.txt");
    fs::create_directory_symlink(outside, root / "dir-out");
    fs::create_symlink(root / "inside.txt", root / "link-in.txt");
    REQUIRE(::mkfifo((root / "fifo").c_str(), 0600) == 0);
  }
};

std::string schema_with_src(const std::string& src) {
  return "<schema name=\"s\"><module name=\"m\" src=\"" + src + "\"/></schema>";
}

std::string read_through(const SrcResolver& files, const std::string& src) {
  const Schema s = parse_schema_string(schema_with_src(src), "s.xml", files);
  REQUIRE(s.root.children.size() == 1);
  REQUIRE(s.root.children[0].children.size() == 1);
  return s.root.children[0].children[0].text;
}

// The src is refused with `kind` (no text read), and the message names the module.
void refused(const SrcResolver& files, const std::string& src,
             ErrorKind kind = ErrorKind::kSchema) {
  INFO("src=\"" << src << "\"");
  try {
    const std::string text = read_through(files, src);
    FAIL("read: " << text);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == kind);
    CHECK(std::string(e.what()).find("<module name=\"m\">") != std::string::npos);
    CHECK(std::string(e.what()).find(kCanary) == std::string::npos);
  }
}

}  // namespace

TEST_CASE("src files: a rooted resolver reads relative paths inside its root", "[pml][src]") {
  Tree t;
  const RootedSrcFiles files(t.root.string());
  CHECK(read_through(files, "inside.txt") == "inside text");
  CHECK(read_through(files, "sub/deep.txt") == "deep text");
  CHECK(read_through(files, "sub/../inside.txt") == "inside text");
  CHECK(read_through(files, "./sub/./deep.txt") == "deep text");
  CHECK(read_through(files, "link-in.txt") == "inside text");  // a link that stays inside
  // Entities are decoded by the XML parser first: the resolver sees the real path.
  CHECK(read_through(files, "sub&#47;deep.txt") == "deep text");
}

TEST_CASE("src files: every way out of the root is refused", "[pml][src]") {
  Tree t;
  const RootedSrcFiles files(t.root.string());
  const std::string canary = (t.outside / "canary.txt").string();
  for (const std::string& src :
       {canary, std::string("/etc/passwd"), std::string("//etc/passwd"),
        std::string("../outside/canary.txt"), std::string("./../outside/canary.txt"),
        std::string("sub/../../outside/canary.txt"), std::string("link-out.txt"),
        std::string("dir-out/canary.txt"), std::string("&#47;etc&#47;passwd"),
        std::string("&#x2F;etc/passwd"), std::string("..&#47;outside/canary.txt"),
        std::string("/proc/self/environ")}) {
    refused(files, src);
  }
  // Not regular files: refused without blocking (a FIFO would hang a plain open).
  refused(files, "fifo");
  refused(files, "sub");
  // Missing: an I/O error naming the file, not a refusal.
  refused(files, "no-such.txt", ErrorKind::kIo);
}

TEST_CASE("src files: the decision is made on the parsed attribute, however it is spelled",
          "[pml][src]") {
  Tree t;
  const RootedSrcFiles files(t.root.string());
  const std::string canary = (t.outside / "canary.txt").string();
  const std::vector<std::string> spellings = {
      // A quoted '>' ends a naive "<module[^>]*src=" filter early.
      "<schema name=\"s\"><module name=\"a\" cache='x>' src=\"" + canary + "\"/></schema>",
      "<schema name=\"s\"><module\n\tname=\"m\"\n\tsrc\n=\n'" + canary + "'/></schema>",
      "<schema name=\"s\"><module src=\"inside.txt\" name=\"m\" src=\"" + canary + "\"/></schema>",
      "<schema name=\"s\"><module name=\"m\"><module name=\"n\" src=\"../outside/canary.txt\"/>"
      "</module></schema>",
      "<schema name=\"s\"><union><module name=\"m\" src=\"link-out.txt\"/></union></schema>",
      "<schema name=\"s\" xmlns:x=\"urn:x\"><module name=\"m\" x:src=\"" + canary + "\"/></schema>",
      "<schema name=\"s\"><module name=\"m\" SRC=\"" + canary + "\"/></schema>",
  };
  for (const std::string& xml : spellings) {
    INFO(xml);
    try {
      const Schema s = parse_schema_string(xml, "s.xml", files);
      FAIL("accepted");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(kCanary) == std::string::npos);
    }
  }
}

TEST_CASE("src files: strings read no files, and kAnywhere reads what the user named",
          "[pml][src]") {
  Tree t;
  refused(NoSrcFiles(), "inside.txt");
  const std::string canary = (t.outside / "canary.txt").string();
  try {
    parse_schema_string(schema_with_src(canary));  // no resolver: none
    FAIL("a schema string read a file");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kSchema);
  }
  const RootedSrcFiles anywhere(t.root.string(), RootedSrcFiles::Scope::kAnywhere);
  CHECK(read_through(anywhere, canary) == kCanary);
  CHECK(read_through(anywhere, "../outside/canary.txt") == kCanary);
  refused(anywhere, "fifo");  // still never a FIFO
}

TEST_CASE("src files: a schema file reads beside itself, and the refusal says how to allow more",
          "[pml][src]") {
  Tree t;
  write(t.root / "s.xml", schema_with_src("inside.txt"));
  write(t.root / "out.xml", schema_with_src("../outside/canary.txt"));
  const Schema s = parse_schema_file((t.root / "s.xml").string());
  CHECK(s.root.children[0].children[0].text == "inside text");
  try {
    parse_schema_file((t.root / "out.xml").string(),
                      src_files_beside((t.root / "out.xml").string(),
                                       RootedSrcFiles::Scope::kInsideRoot, " (use --flag)"));
    FAIL("read outside");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("out.xml:1:") != std::string::npos);
    CHECK(std::string(e.what()).find("use --flag") != std::string::npos);
  }
}

TEST_CASE("src files: is_inside compares whole path components", "[pml][src]") {
  CHECK(RootedSrcFiles::is_inside("/a/b/c", "/a/b"));
  CHECK(RootedSrcFiles::is_inside("/a/b", "/a/b"));
  CHECK(RootedSrcFiles::is_inside("/a/b/c", "/a/b/"));
  CHECK_FALSE(RootedSrcFiles::is_inside("/a/bc", "/a/b"));
  CHECK_FALSE(RootedSrcFiles::is_inside("/a", "/a/b"));
  CHECK_FALSE(RootedSrcFiles::is_inside("/etc/passwd", "/a/b"));
}
