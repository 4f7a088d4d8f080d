#!/usr/bin/env python3
"""`promptcache template` against the reference: Debian's python3-jinja2 rendering each real chat
template of tests/jinja/templates exactly as transformers' apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks, loop controls, raise_exception and
strftime_now as globals, a tojson that is json.dumps(ensure_ascii=False)), on every message list of
tests/jinja/messages, with and without add_generation_prompt and tools.

Each case must agree byte for byte: the same text, or both raising the template's own
raise_exception message (which `promptcache template` prints on stderr), or both failing.
The model folder of each case is made here: tokenizer_config.json with the template's
bos/eos tokens and the template itself, alternately as its chat_template field and as a
chat_template.jinja file beside it.

usage: compare_reference.py PROMPTCACHE_BINARY   (exit 77: python3-jinja2 is missing)
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3-jinja2 is not installed (scripts/install-deps.sh --tests)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))

# bos_token, eos_token of each template's model (None: the model has none), and extra variables.
MODELS = {
    "qwen3": (None, "<|im_end|>", [{}, {"enable_thinking": False}]),
    "gemma-2": ("<bos>", "<eos>", [{}]),
    "phi-3.5": ("<s>", "<|endoftext|>", [{}]),
    "llama-3.3-tools": ("<|begin_of_text|>", "<|eot_id|>", [{}, {"date_string": "01 Jan 2025"}]),
    "mistral-nemo": ("<s>", "</s>", [{}]),
    "deepseek-r1-distill-qwen": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", [{}]),
    "command-r7b-tool-use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", [{}, {"enable_citations": True}]),
    "cz-llama-2-chat": ("<s>", "</s>", [{}]),
    "cz-zephyr": ("<s>", "</s>", [{}]),
    "cz-mistral-instruct": ("<s>", "</s>", [{}]),
    "cz-chatml": ("", "<|im_end|>", [{}]),
    "cz-qwen2.5-instruct": (None, "<|im_end|>", [{}]),
    "cz-phi-3": ("<s>", "<|endoftext|>", [{}]),
    "cz-gemma-it": ("<bos>", "<eos>", [{}]),
    "cz-llama-3-instruct": ("<|begin_of_text|>", "<|eot_id|>", [{}]),
    "cz-granite-3.0-instruct": ("<|end_of_text|>", "<|end_of_text|>", [{}]),
    "cz-llama-3.2-1b-instruct": ("<|begin_of_text|>", "<|eot_id|>", [{}]),
    "cz-vicuna": ("<s>", "</s>", [{}]),
    "cz-openchat": ("<s>", "<|end_of_turn|>", [{}]),
    "cz-falcon": (None, "<|endoftext|>", [{}]),
    "cz-alpaca": ("<s>", "</s>", [{}]),
    "phi-4-mini": ("<|endoftext|>", "<|endoftext|>", [{}]),
}
# The feature templates (tests/jinja/features, written for these tests): the rest of the subset,
# on two message lists.
FEATURES = ["expressions", "collections", "statements", "whitespace"]
FEATURE_MESSAGES = {"system_multi", "unicode"}
# Message lists rendered with the tools list too.
WITH_TOOLS = {"system_user", "tool_calls", "multi_turn", "user"}


class RaisedException(TemplateError):
    """The template's own raise_exception (HF raises a TemplateError; jinja2's UndefinedError, a
    TemplateError too, is a failure of the template instead, not a message of its own)."""


def reference(template, messages, add_generation_prompt, tools, bos, eos, extra):
    def raise_exception(message):
        raise RaisedException(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    tokens = {}
    if bos is not None:
        tokens["bos_token"] = bos
    if eos is not None:
        tokens["eos_token"] = eos
    return env.from_string(template).render(messages=messages, tools=tools, documents=None,
                                            add_generation_prompt=add_generation_prompt,
                                            **tokens, **extra)


def difference(want, got):
    """Where two texts first differ, with a little context."""
    i = 0
    while i < min(len(want), len(got)) and want[i] == got[i]:
        i += 1
    return f"first difference at character {i}: expected {want[max(0, i - 40):i + 40]!r}, got {got[max(0, i - 40):i + 40]!r}"


# Templates written into a GGUF file by `promptcache convert` (the tiny shape's vocabulary has
# <s> and </s> as its BOS and EOS), alternately from tokenizer_config.json and chat_template.jinja.
GGUF_TEMPLATES = ["cz-llama-2-chat", "qwen3", "cz-qwen2.5-instruct", "mistral-nemo"]


def gguf_cases(binary, tmp, message_sets, counts, failures):
    model = os.path.join(tmp, "gguf-model")
    run = subprocess.run([binary, "make-model", "--shape", "tiny", "--out", model],
                         capture_output=True, timeout=300)
    if run.returncode != 0:
        failures.append(f"make-model: rc {run.returncode}: {run.stderr.decode()}")
        return
    config_path = os.path.join(model, "tokenizer_config.json")
    base = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            base = json.load(f)
    for index, name in enumerate(GGUF_TEMPLATES):
        with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        config = dict(base)
        jinja_file = os.path.join(model, "chat_template.jinja")
        if os.path.exists(jinja_file):
            os.remove(jinja_file)
        if index % 2 == 0:
            config["chat_template"] = template
        else:
            config.pop("chat_template", None)
            with open(jinja_file, "w", encoding="utf-8") as f:
                f.write(template)
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False)
        out = os.path.join(tmp, name + ".gguf")
        run = subprocess.run([binary, "convert", "--model", model, "--out", out, "--type", "f32"],
                             capture_output=True, timeout=300)
        if run.returncode != 0:
            failures.append(f"convert ({name}): rc {run.returncode}: {run.stderr.decode()}")
            continue
        for message_set in message_sets:
            path = os.path.join(HERE, "messages", message_set + ".json")
            with open(path, encoding="utf-8") as f:
                messages = json.load(f)
            for agp in (False, True):
                case = f"GGUF {name} × {message_set}{' +gen' if agp else ''}"
                try:
                    want, want_raise = reference(template, messages, agp, None, "<s>", "</s>", {}), None
                except RaisedException as e:
                    want, want_raise = None, str(e)
                except Exception:
                    continue  # both-fail cases are covered by the folder runs above
                command = [binary, "template", "--model", out, "--messages", path]
                if agp:
                    command.append("--add-generation-prompt")
                run = subprocess.run(command, capture_output=True, timeout=60)
                got, err = run.stdout.decode("utf-8", "replace"), run.stderr.decode("utf-8", "replace")
                if want is not None and run.returncode == 0 and got == want:
                    counts["GGUF same text"] = counts.get("GGUF same text", 0) + 1
                elif want_raise is not None and run.returncode != 0 and want_raise in err:
                    counts["GGUF same raise"] = counts.get("GGUF same raise", 0) + 1
                else:
                    detail = difference(want, got) if want is not None else f"expected raise {want_raise!r}"
                    failures.append(f"{case}: rc {run.returncode}, {detail}\n  stderr {err.strip()}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    print(f"reference: jinja2 {jinja2.__version__} ({jinja2.__file__})")
    message_sets = sorted(f[:-5] for f in os.listdir(os.path.join(HERE, "messages")) if f.endswith(".json"))
    tools_file = os.path.join(HERE, "tools", "weather.json")
    with open(tools_file, encoding="utf-8") as f:
        tools = json.load(f)
    counts = {"same text": 0, "same raise": 0, "both fail": 0}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        models = [("templates", name, spec) for name, spec in sorted(MODELS.items())]
        models += [("features", name, ("<s>", "</s>", [{}])) for name in FEATURES]
        for index, (kind, name, (bos, eos, var_sets)) in enumerate(models):
            with open(os.path.join(HERE, kind, name + ".jinja"), encoding="utf-8") as f:
                template = f.read()
            folder = os.path.join(tmp, name)
            os.mkdir(folder)
            config = {"bos_token": bos, "eos_token": eos}
            if index % 2 == 0:
                config["chat_template"] = template
            else:
                with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
                    f.write(template)
            with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f, ensure_ascii=False, indent=2)
            for message_set in message_sets:
                if kind == "features" and message_set not in FEATURE_MESSAGES:
                    continue
                path = os.path.join(HERE, "messages", message_set + ".json")
                with open(path, encoding="utf-8") as f:
                    messages = json.load(f)
                for use_tools in ([False, True] if message_set in WITH_TOOLS else [False]):
                    for agp in (False, True):
                        for extra in var_sets:
                            case = f"{name} × {message_set}{' +tools' if use_tools else ''}" \
                                   f"{' +gen' if agp else ''}{' ' + json.dumps(extra) if extra else ''}"
                            try:
                                want, want_raise, want_error = reference(
                                    template, messages, agp, tools if use_tools else None, bos,
                                    eos, extra), None, None
                            except RaisedException as e:
                                want, want_raise, want_error = None, str(e), None
                            except Exception as e:  # TypeError, UndefinedError, SecurityError...
                                want, want_raise, want_error = None, None, f"{type(e).__name__}: {e}"
                            command = [binary, "template", "--model", folder, "--messages", path]
                            if agp:
                                command.append("--add-generation-prompt")
                            if use_tools:
                                command += ["--tools", tools_file]
                            for key, value in extra.items():
                                command += ["--var", f"{key}={json.dumps(value)}"]
                            run = subprocess.run(command, capture_output=True, timeout=60)
                            got, err = run.stdout.decode("utf-8", "replace"), run.stderr.decode("utf-8", "replace")
                            if want is not None:
                                if run.returncode == 0 and got == want:
                                    counts["same text"] += 1
                                else:
                                    failures.append(f"{case}: rc {run.returncode}, {difference(want, got)}\n  stderr {err.strip()}")
                            elif want_raise is not None:
                                if run.returncode != 0 and want_raise in err and got == "":
                                    counts["same raise"] += 1
                                else:
                                    failures.append(f"{case}: expected raise_exception({want_raise!r})\n  got (rc {run.returncode}) {got!r}\n  stderr {err.strip()}")
                            else:
                                if run.returncode != 0 and run.returncode != 3 and got == "":
                                    counts["both fail"] += 1
                                else:
                                    failures.append(f"{case}: expected an error ({want_error})\n  got (rc {run.returncode}) {got!r}\n  stderr {err.strip()}")
        # The command's own errors: each exits non-zero, names the file and line, prints no text.
        messages = os.path.join(HERE, "messages", "user.json")
        empty = os.path.join(tmp, "no-template")
        os.mkdir(empty)
        gguf = os.path.join(tmp, "model.gguf")
        bad = os.path.join(tmp, "bad.jinja")
        with open(gguf, "wb") as f:
            f.write(b"GGUF")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("line 1\n{% for m in messages %}\n{{ m.content | no_such_filter }}\n{% endfor %}")
        checks = [
            (["--model", gguf], 1, "model.gguf"),
            (["--model", empty], 1, "no chat template"),
            (["--template", bad], 1, "bad.jinja:3:"),
            (["--template", bad, "--var", "novalue"], 2, "NAME=VALUE"),
        ]
        for args, code, text in checks:
            run = subprocess.run([binary, "template", "--messages", messages] + args,
                                 capture_output=True, timeout=60)
            err = run.stderr.decode("utf-8", "replace")
            if run.returncode == code and text in err and run.stdout == b"":
                counts["command errors"] = counts.get("command errors", 0) + 1
            else:
                failures.append(f"template {' '.join(args)}: expected exit {code} and {text!r} on "
                                f"stderr, got {run.returncode}: {err.strip()}")
        # GGUF: `promptcache convert` writes the folder's template as tokenizer.chat_template, and
        # `promptcache template --model FILE.gguf` renders it with the vocabulary's bos/eos tokens.
        gguf_cases(binary, tmp, message_sets, counts, failures)
    total = sum(counts.values())
    print(f"{len(MODELS)} templates and {len(FEATURES)} feature templates, {total + len(failures)} cases: " +
          ", ".join(f"{v} {k}" for k, v in counts.items()) + f", {len(failures)} mismatches")
    for failure in failures:
        print("MISMATCH " + failure)
    return 1 if failures or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
