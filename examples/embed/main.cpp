// Linking promptcache from another CMake project: open a model, add a schema, ask twice.
//   embed MODEL_DIR
#include <promptcache/promptcache.hpp>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: embed MODEL_DIR   (make one: promptcache make-model --out DIR)\n";
    return 2;
  }
  try {
    auto engine = promptcache::Engine::open(argv[1]);
    engine->add_schema_string(R"(<schema name="hello">
      <module name="intro">Once upon a time, there was a little girl named Lily.</module>
    </schema>)");
    promptcache::SamplingParams params;
    params.max_new_tokens = 8;
    const char* prompt = R"(<prompt schema="hello"><intro/> One day,</prompt>)";
    const auto cached = engine->generate_xml(prompt, params);
    const auto plain = engine->generate_xml(prompt, params, {}, promptcache::RequestOptions{false});
    std::cout << cached.text << "\n"
              << "TTFT cached " << cached.timings.ttft_ms << " ms, uncached "
              << plain.timings.ttft_ms
              << " ms, same answer: " << (cached.tokens == plain.tokens ? "yes" : "no") << "\n";
    return cached.tokens == plain.tokens ? 0 : 1;
  } catch (const promptcache::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
