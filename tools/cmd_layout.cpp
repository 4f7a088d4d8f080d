// promptcache layout: a schema as its author needs to see it — spans, positions, cached or not —
// plus warnings. Needs only config.json and the tokenizer, not the weights.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "cli_common.hpp"
#include "promptcache/jinja/derive.hpp"
#include "promptcache/model/config.hpp"
#include "promptcache/model/gguf_config.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/render.hpp"

namespace promptcache::cli {

std::vector<std::string> layout_warnings(const pml::Layout& layout, int64_t context,
                                         const Tokenizer& tokenizer) {
  std::vector<std::string> warnings;
  if (static_cast<int64_t>(layout.total_length) > context) {
    warnings.push_back(fmt::format("the schema reserves {} positions but the model's context is {}",
                                   layout.total_length, context));
  }
  for (const auto& m : layout.modules) {
    const std::string name = m.is_root() ? "(root)" : m.path;
    if (static_cast<int64_t>(m.length()) > context) {
      warnings.push_back(fmt::format("module '{}' ({} tokens) is larger than the context ({})",
                                     name, m.length(), context));
    }
    if (m.length() == 0) warnings.push_back(fmt::format("module '{}' is empty", name));
  }
  for (std::size_t u = 0; u < layout.unions.size(); ++u) {
    const auto& un = layout.unions[u];
    std::size_t shortest = SIZE_MAX;
    for (std::size_t m : un.members) shortest = std::min(shortest, layout.modules[m].length());
    for (std::size_t m : un.members) {
      const std::size_t len = layout.modules[m].length();
      if (len > 2 * shortest && len - shortest >= 8) {
        warnings.push_back(fmt::format(
            "union member '{}' ({} tokens) is much longer than its shortest sibling ({} tokens): "
            "every member reserves {} positions",
            layout.modules[m].path, len, shortest, un.length));
      }
    }
  }
  for (const auto& s : layout.spans) {
    if (s.kind != pml::SpanKind::kParameter || s.text.empty()) continue;
    const std::size_t need = pml::encode_span(tokenizer, s.text).size();
    if (need > s.size()) {
      warnings.push_back(fmt::format(
          "parameter '{}' reserves {} positions but its scaffold \"{}\" has {} tokens (cut)",
          s.parameter, s.size(), s.text, need));
    }
  }
  return warnings;
}

Command register_layout(CLI::App& root) {
  struct Options {
    bool allow_src_outside = false;
    std::string schema;
    ModelOptions model;
    std::string chat_template;
    bool ids = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "layout",
      "Show a schema's modules, token counts, position ranges and what is cached.\n"
      "Example: promptcache layout schemas/docqa.xml --model /tmp/tiny");
  app->add_option("schema", o->schema, "schema XML file")->required();
  add_src_flag(*app, o->allow_src_outside);
  app->add_option("--model,-m", o->model.model_dir, "model folder (its tokenizer and context)");
  app->add_option(
      "--template", o->chat_template,
      "chat template: llama-2, llama-3, mistral, chatml, plain, or jinja (the model's own "
      "template) (default: from the model)");
  app->add_flag("--ids", o->ids, "show token ids");
  return {app, [o]() {
            require_model(o->model);
            const auto config = gguf::load_model_config(o->model.model_dir);
            const auto tok = load_tokenizer(o->model.model_dir);
            const auto chosen = jinja::model_chat_template(o->model.model_dir, o->chat_template,
                                                           config.chat_template, *tok,
                                                           config.default_chat_template());
            const pml::ChatTemplate& tmpl = chosen.chat;
            // The hand-written families are named in the first line already; a model's own
            // template is named by its source.
            if (tmpl.family == "jinja") std::cout << "chat template: " << chosen.origin << "\n";
            const auto schema = read_schema_file(o->schema, o->allow_src_outside);
            print_warnings(schema.warnings);
            // Over-long schemas are shown, with warnings; only one far past any use (64 times
            // the context) is refused, before a 100 MB module would be tokenized for minutes.
            pml::LayoutOptions limits;
            limits.max_positions = 64 * static_cast<std::size_t>(config.max_position_embeddings);
            limits.limit_name = "the most `layout` shows, 64 times the model's context";
            const auto layout = pml::layout(schema, *tok, tmpl, limits);
            pml::RenderOptions render;
            render.show_ids = o->ids;
            std::cout << pml::render_layout(layout, render);
            std::cout << fmt::format("total: {} of {} context positions\n", layout.total_length,
                                     config.max_position_embeddings);
            for (const auto& w : layout_warnings(layout, config.max_position_embeddings, *tok)) {
              std::cout << "warning: " << w << "\n";
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
