// Document question answering with the public API, in one screen:
//   docqa MODEL_DIR QUESTION DOC.txt [DOC.txt ...]
// Every document becomes a prompt module (its text read through src=), compiled once; the
// question is the only part of the prompt the model runs. The CLI's `promptcache qa` does the
// same with folders, an interactive loop and document selection.
#include <promptcache/promptcache.hpp>

#include <filesystem>
#include <iostream>

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s)
    out += c == '<'   ? "&lt;"
           : c == '>' ? "&gt;"
           : c == '&' ? "&amp;"
           : c == '"' ? "&quot;"
                      : std::string(1, c);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: docqa MODEL_DIR QUESTION DOC.txt [DOC.txt ...]\n";
    return 2;
  }
  try {
    auto engine = promptcache::Engine::open(argv[1]);
    std::string schema =
        "<schema name=\"docs\"><system>Answer using only these documents.</system>";
    std::string prompt = "<prompt schema=\"docs\">";
    for (int i = 3; i < argc; ++i) {
      const std::string name = "doc" + std::to_string(i - 3);
      schema += "<module name=\"" + name + "\" src=\"" +
                escape(std::filesystem::absolute(argv[i]).string()) + "\"/>";
      prompt += "<" + name + "/>";
    }
    schema += "</schema>";
    prompt += "<user>" + escape(argv[2]) + "</user></prompt>";

    // Compile once: every document's K/V. The src files are the ones named on the command line,
    // so the schema may read any path (a schema from elsewhere would get a narrower resolver).
    engine->add_schema(promptcache::pml::parse_schema_string(
        schema, "<docs>",
        promptcache::pml::RootedSrcFiles("", promptcache::pml::RootedSrcFiles::Scope::kAnywhere)));
    promptcache::SamplingParams params;
    params.max_new_tokens = 48;
    const auto r =
        engine->generate_xml(prompt, params, [](promptcache::TokenId, const std::string& t) {
          std::cout << t << std::flush;
          return true;
        });
    std::cout << "\n[TTFT " << r.timings.ttft_ms << " ms, " << r.cached_tokens << " cached + "
              << r.fresh_tokens << " fresh tokens]\n";
    return 0;
  } catch (const promptcache::Error& e) {
    std::cerr << "docqa: " << e.what() << "\n";
    return 1;
  }
}
