# tests/fuzz/entries.cmake — the fuzz entry functions (fuzz_entries.hpp) as small libraries, by
# what they link: PML only, promptcache_core (tokenizers; config.json; Redis values), the server's request unit,
# LibTorch (safetensors, cache files). Included by tests/CMakeLists.txt (the fuzz_replay test, regular compiler) and by
# tests/fuzz/CMakeLists.txt (the libFuzzer targets, -DPROMPTCACHE_FUZZ=ON).
if(NOT TARGET promptcache_fuzz_pml)
  set(PROMPTCACHE_FUZZ_SOURCE_DIR ${PROJECT_SOURCE_DIR}/tests/fuzz)
  add_library(promptcache_fuzz_pml STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_pml.cpp)
  target_link_libraries(promptcache_fuzz_pml PUBLIC promptcache_pml)
  add_library(promptcache_fuzz_tokenizer STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_tokenizer.cpp)
  target_link_libraries(promptcache_fuzz_tokenizer PUBLIC promptcache_core)
  add_library(promptcache_fuzz_model STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_model.cpp)
  target_link_libraries(promptcache_fuzz_model PUBLIC promptcache)
  target_include_directories(promptcache_fuzz_model PRIVATE ${XXHASH_INCLUDE_DIR})
  # The server's edge (http_request, openai_json, posted_pml) and config.json (config_json):
  # LibTorch-free, so CI can build and fuzz them without a clang build of LibTorch code.
  add_library(promptcache_fuzz_request STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_request.cpp)
  target_link_libraries(promptcache_fuzz_request PUBLIC promptcache_request)
  add_library(promptcache_fuzz_config STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_config.cpp
              ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_gguf.cpp)
  target_link_libraries(promptcache_fuzz_config PUBLIC promptcache_core)
  # The Redis tier's sealed values (redis_value): LibTorch-free as well.
  add_library(promptcache_fuzz_states STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_states.cpp)
  target_link_libraries(promptcache_fuzz_states PUBLIC promptcache_core)
  # An eval dataset's lines (eval_row): promptcache_eval_rows, LibTorch-free too.
  add_library(promptcache_fuzz_eval STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_eval.cpp)
  target_link_libraries(promptcache_fuzz_eval PUBLIC promptcache_eval_rows)
  # Chat templates (chat_template): promptcache_jinja, LibTorch-free.
  add_library(promptcache_fuzz_jinja STATIC ${PROMPTCACHE_FUZZ_SOURCE_DIR}/entries_jinja.cpp)
  target_link_libraries(promptcache_fuzz_jinja PUBLIC promptcache_jinja)
  foreach(kind pml tokenizer model request config states eval jinja)
    # Entries include "fuzz/fuzz_entries.hpp" and the PML tests' "pml/fake_tokenizer.hpp".
    target_include_directories(promptcache_fuzz_${kind} PUBLIC ${PROJECT_SOURCE_DIR}/tests)
    target_compile_options(promptcache_fuzz_${kind} PRIVATE -Wall -Wextra)
  endforeach()
endif()
set(PROMPTCACHE_FUZZ_TARGETS schema prompt tokenizer_json sentencepiece safetensors cache_file
    redis_value)
# The server's edge and config.json (LibTorch-free, like the PML and tokenizer targets).
list(APPEND PROMPTCACHE_FUZZ_TARGETS http_request openai_json posted_pml config_json eval_row)
list(APPEND PROMPTCACHE_FUZZ_TARGETS chat_template)
# GGUF model files (gguf): LibTorch-free too, in the config entries' library.
list(APPEND PROMPTCACHE_FUZZ_TARGETS gguf)
