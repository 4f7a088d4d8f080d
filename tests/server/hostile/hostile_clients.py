#!/usr/bin/env python3
"""Hostile clients against a real `promptcache serve` process (issue 31, item 8).

    python3 tests/server/hostile/hostile_clients.py build/promptcache [--only SUBSTR] [--keep]

Makes a tiny random model, starts four `serve` processes on 127.0.0.1 (port 0) with the flag sets
the cases need, plants canary files, and sends every hostile request we could think of:
module src in every spelling (with and without --schema-root), huge and deep bodies, slow and
broken connections, foreign Origin and Host headers, wrong content types, API keys, budgets and
compile cancellation. The contract is /work/spec31.md (docs/server.md "Security").

After EVERY case: no response body seen so far (plus GET /v1/schemas, GET /v1/schemas/NAME of
every listed schema and /metrics) holds the outside canary's marker or a system file's text, the
process is alive, GET /health answers 200 within a few seconds, and a known-good schema, prompt
and chat completion answer 200. A server that died is restarted (and the case fails), so one
crash does not hide the rest.

Prints `ok NAME` / `FAIL NAME: why` per case and `N passed, M failed` last; exits 1 if M > 0.
Python 3 standard library only; loopback only; every loop bounded; every process killed at exit
(and, through PR_SET_PDEATHSIG, when this script is killed).

Where spec31 leaves room, the stricter reading is tested:
- a DOCTYPE that declares entities is refused (4xx), also when the entity is only used in text
  (the parser does not expand it, so accepting it would serve the literal "&p;");
- numbers that overflow (1e400) are a 400; ones that underflow (1e-400) are 0 and accepted;
- an absolute src that points inside --schema-root is refused (only relative paths resolve);
- a missing, unreadable or non-regular src file (directory, FIFO, too long) is the client's
  error (4xx), not a 500;
- a POST without any Content-Type is a 415; `https://` + Host is the server's own origin too
  (a TLS proxy that keeps Host), `https://` + another host is not;
- a 413 for a Content-Length over the limit comes before (without draining) the body, and a
  chunked body gets 411 (Length Required) before any of it is read;
- an invalid-UTF-8 schema name is a 400;
- slow-loris: fewer slow-header connections than --http-threads must not starve a good client;
  more of them hold every connection thread while they drip (cpp-httplib has no header
  deadline; docs/server.md says to put a proxy with header timeouts in front), and the server
  must answer at once when they are gone.

Debugging this script against a build without some issue-31 flags:
HOSTILE_STRIP_UNKNOWN_FLAGS=1 drops the flags `serve --help` does not list (--api-key-file
becomes --api-key); the cases that need them then fail. `--only a,b` runs the cases whose name
holds a or b; `--keep` keeps the work folder (server logs, canaries).
"""

import http.client
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HOST = "127.0.0.1"
T_START = time.monotonic()


def die_with_parent():
    """In the child: SIGKILL when this script dies, even by SIGKILL (a CTest timeout)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class CaseFailure(Exception):
    pass


def check(cond, why):
    if not cond:
        raise CaseFailure(why)


def short(b, n=300):
    if isinstance(b, (bytes, bytearray)):
        b = b.decode("utf-8", "replace")
    b = str(b)
    return b if len(b) <= n else b[:n] + "...(%d chars)" % len(b)


# ---------------------------------------------------------------------------------------------
# Servers


class Server:
    """One `promptcache serve` process, restarted when it dies."""

    def __init__(self, suite, label, extra_args, headers=None, env_extra=None):
        self.suite = suite
        self.label = label
        self.extra_args = list(extra_args)
        self.headers = dict(headers or {})  # sent with every request (the API key)
        self.env_extra = dict(env_extra or {})
        self.proc = None
        self.port = None
        self.start_error = None
        self.stderr_path = None
        self.seen = []  # response bodies since the last leak scan
        self.seen_lock = threading.Lock()
        self.starts = 0
        self.inside_root_allowed = False  # set for the --schema-root server

    # -- process --------------------------------------------------------------------------------
    def launch(self):
        """Starts the process (does not wait for the port)."""
        self.starts += 1
        self.port = None
        self.start_error = None
        self.stderr_path = os.path.join(self.suite.tmp, "serve-%s-%d.log" % (self.label, self.starts))
        cmd = [self.suite.cli, "serve", "--model", self.suite.model_dir, "--host", HOST,
               "--port", "0", "--threads", "1"] + self.extra_args
        env = dict(os.environ)
        env.pop("PROMPTCACHE_API_KEY", None)
        env["PROMPTCACHE_HOSTILE_ENV_CANARY"] = self.suite.env_marker
        env.update(self.env_extra)
        self.cmd = cmd
        self.stderr_file = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.stderr_file,
                                     stderr=self.stderr_file, env=env, start_new_session=True,
                                     preexec_fn=die_with_parent)

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        prefix = "promptcache serve: listening on http://"
        while time.monotonic() < deadline:
            text = self.log_text()
            for line in text.splitlines():
                if line.startswith(prefix):
                    hostport = line[len(prefix):].rstrip("/ \r")
                    self.port = int(hostport.rsplit(":", 1)[1])
                    return True
            if self.proc.poll() is not None:
                self.start_error = "serve exited with %s at start: %s" % (
                    self.proc.returncode, short(self.log_tail(), 600))
                return False
            time.sleep(0.05)
        self.start_error = "no 'listening on' line within %ds: %s" % (timeout, short(self.log_tail()))
        return False

    def log_text(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=1500):
        return self.log_text()[-n:]

    def alive(self):
        return self.proc is not None and self.proc.poll() is None and self.port is not None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            try:
                self.stderr_file.close()
            except OSError:
                pass

    def restart(self):
        self.kill()
        self.launch()
        return self.wait_ready()

    def origin(self):
        return "http://%s:%d" % (HOST, self.port)

    def record(self, body):
        with self.seen_lock:
            self.seen.append(body)

    # -- HTTP -----------------------------------------------------------------------------------
    def request(self, method, path, body=None, headers=None, timeout=30, content_type=None,
                use_default_headers=True):
        """(status, {lower header: value}, body bytes); status None on a connection error."""
        h = dict(self.headers) if use_default_headers else {}
        if content_type is not None:
            h["Content-Type"] = content_type
        h.update(headers or {})
        if isinstance(body, str):
            body = body.encode("utf-8")
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            self.record(data)
            return resp.status, hdrs, data
        except (OSError, http.client.HTTPException) as e:
            return None, {}, ("%s: %s" % (type(e).__name__, e)).encode()
        finally:
            conn.close()

    def post_json(self, path, obj, **kw):
        body = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
        return self.request("POST", path, body, content_type=kw.pop("content_type",
                                                                     "application/json"), **kw)

    def post_xml(self, xml, stream=False, **kw):
        path = "/v1/schemas" + ("" if stream else "?stream=false")
        return self.request("POST", path, xml, content_type=kw.pop("content_type",
                                                                    "application/xml"), **kw)

    def raw(self, data, timeout=10, idle=1.5):
        """Sends bytes on a fresh connection and reads until the server closes it, `timeout`
        passes, or nothing more came for `idle` seconds after something came; returns bytes."""
        s = socket.create_connection((HOST, self.port), timeout=timeout)
        out = b""
        try:
            try:
                s.sendall(data)
            except OSError:
                pass  # the server may close early; what it answered is still read
            deadline = time.monotonic() + timeout
            s.settimeout(0.25)
            last = None
            while time.monotonic() < deadline:
                if last is not None and time.monotonic() - last > idle:
                    break
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
                last = time.monotonic()
                if len(out) > 16 << 20:
                    break
        finally:
            s.close()
        self.record(out)
        return out


def parse_json(body):
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def expect_error(resp, lo=400, hi=499, status=None, words=None, limit=None, etype=None):
    """A refusal: the status, a JSON body {"error": {"message": ...}} naming the problem."""
    code, hdrs, body = resp
    check(code is not None, "no response: %s" % short(body))
    if status is not None:
        check(code == status, "status %s, expected %s: %s" % (code, status, short(body)))
    else:
        check(lo <= code <= hi, "status %s, expected %d..%d: %s" % (code, lo, hi, short(body)))
    j = parse_json(body)
    check(isinstance(j, dict) and isinstance(j.get("error"), dict),
          "status %s but the body is not {\"error\": {...}}: %s" % (code, short(body)))
    msg = j["error"].get("message")
    check(isinstance(msg, str) and msg.strip(), "error without a message: %s" % short(body))
    if words:
        low = msg.lower()
        check(any(w.lower() in low for w in words),
              "message does not name the problem (wanted one of %s): %s" % (words, short(msg)))
    if limit is not None:
        check(j["error"].get("limit") == limit,
              "error.limit is %r, expected %r: %s" % (j["error"].get("limit"), limit, short(body)))
    if etype is not None:
        check(j["error"].get("type") == etype,
              "error.type is %r, expected %r: %s" % (j["error"].get("type"), etype, short(body)))
    return j


def expect_ok(resp, what="request"):
    code, _, body = resp
    check(code == 200, "%s: status %s: %s" % (what, code, short(body)))
    j = parse_json(body)
    check(j is not None, "%s: 200 but not JSON: %s" % (what, short(body)))
    return j


# ---------------------------------------------------------------------------------------------
# The suite

GOOD_SCHEMA = ('<schema name="hgood"><module name="m">The quick brown fox jumps over the lazy '
               'dog.</module></schema>')
GOOD_PROMPT = {"prompt": '<prompt schema="hgood"><m/><user>hi</user></prompt>',
               "max_new_tokens": 2, "temperature": 0}
GOOD_CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


class Suite:
    def __init__(self, cli, only=None, keep=False):
        self.cli = os.path.abspath(cli)
        self.only = only
        self.keep = keep
        self.tmp = tempfile.mkdtemp(prefix="promptcache-hostile-")
        self.results = []
        self.servers = []
        rnd = random.Random()
        self.out_marker = "OUTSIDE-CANARY-%016x" % rnd.getrandbits(64)
        self.in_marker = "INSIDE-CANARY-%016x" % rnd.getrandbits(64)
        self.env_marker = "ENV-CANARY-%016x" % rnd.getrandbits(64)
        self.api_key = "hostile-key-%016x" % rnd.getrandbits(64)
        self.forbidden = []  # (text, what) that no response may contain

    # -- set-up ---------------------------------------------------------------------------------
    def plant(self):
        t = self.tmp
        os.makedirs(os.path.join(t, "secret"))
        self.secret = os.path.join(t, "secret", "canary.txt")
        with open(self.secret, "w") as f:
            f.write("%s\n" % self.out_marker * 3 + "the outside canary %s\n" % self.out_marker)
        self.root = os.path.join(t, "root")
        os.makedirs(os.path.join(self.root, "sub"))
        self.inside = os.path.join(self.root, "ok.txt")
        with open(self.inside, "w") as f:
            f.write("inside text %s" % self.in_marker)
        with open(os.path.join(self.root, "sub", "ok2.txt"), "w") as f:
            f.write("inside sub text %s" % self.in_marker)
        os.symlink(self.secret, os.path.join(self.root, "link.txt"))
        os.symlink(os.path.join(t, "secret"), os.path.join(self.root, "linkdir"))
        os.symlink("../secret/canary.txt", os.path.join(self.root, "rellink.txt"))
        os.mkfifo(os.path.join(self.root, "fifo"))
        self.keyfile = os.path.join(t, "api-key.txt")
        with open(self.keyfile, "w") as f:
            f.write(self.api_key + "  \n# the rest of the file is not the key\n")

        self.forbidden = [(self.out_marker, "the outside canary's marker"),
                          (self.env_marker, "the server's environment (/proc/self/environ)"),
                          ("root:x:0:0", "/etc/passwd"),
                          (self.api_key, "the API key")]
        try:
            with open("/etc/passwd") as f:
                first = f.readline().strip()
            if len(first) >= 12:
                self.forbidden.append((first, "/etc/passwd's first line"))
        except OSError:
            pass
        try:
            with open("/etc/hostname") as f:
                hn = f.read().strip()
            if len(hn) >= 10 and hn not in ("localhost", "localhost.localdomain"):
                self.forbidden.append((hn, "/etc/hostname"))
        except OSError:
            pass

    def make_model(self):
        self.model_dir = os.path.join(self.tmp, "tiny")
        r = subprocess.run([self.cli, "make-model", "--shape", "tiny", "--out", self.model_dir],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("make-model failed: %s" % short(r.stdout, 2000))

    def start_servers(self):
        key_hdr = {"Authorization": "Bearer " + self.api_key}
        self.plain = Server(self, "plain", ["--allowed-origins", "http://good.example",
                                            "--allowed-hosts", "good.host"])
        self.rooted = Server(self, "root", ["--schema-root", self.root])
        self.rooted.inside_root_allowed = True
        self.keyed = Server(self, "key", ["--api-key-file", self.keyfile], headers=key_hdr)
        self.budget = Server(self, "budget", ["--max-schemas", "2", "--max-body-bytes", "65536",
                                              "--max-queue", "2", "--max-batch", "1",
                                              "--max-schema-positions", "600"])
        self.servers = [self.plain, self.rooted, self.keyed, self.budget]
        if os.environ.get("HOSTILE_STRIP_UNKNOWN_FLAGS") == "1":
            # Only to debug this script against a build without the issue-31 flags: flags the
            # binary does not know are dropped (the cases that need them then fail).
            help_text = subprocess.run([self.cli, "serve", "--help"], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, timeout=60).stdout.decode()
            for s in self.servers:
                args, i = [], 0
                while i < len(s.extra_args):
                    flag, value = s.extra_args[i], s.extra_args[i + 1]
                    i += 2
                    if flag + " " in help_text or flag + "," in help_text:
                        args.append(flag)
                        args.append(value)
                    elif flag == "--api-key-file":
                        args += ["--api-key", self.api_key]
                        print("note: --api-key-file unknown: %s uses --api-key" % s.label)
                    else:
                        print("note: %s unknown to this build: dropped from %s" % (flag, s.label))
                s.extra_args = args
        for s in self.servers:
            s.launch()
        for s in self.servers:
            if not s.wait_ready():
                print("note: server %s did not start: %s" % (s.label, s.start_error), flush=True)

    def cleanup(self):
        for s in self.servers:
            s.kill()
        if not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- after every case -----------------------------------------------------------------------
    def leak_scan(self, srv):
        """No response body of srv holds a forbidden text (and, without --schema-root, none
        holds the inside canary)."""
        extra = []
        st, _, body = srv.request("GET", "/v1/schemas", timeout=10)
        names = []
        j = parse_json(body) if st == 200 else None
        if j:
            for s in j.get("schemas", []):
                if isinstance(s, dict) and isinstance(s.get("name"), str):
                    names.append(s["name"])
        for n in names[:80]:
            srv.request("GET", "/v1/schemas/" + urlquote(n), timeout=10)
        srv.request("GET", "/metrics", timeout=10)
        forbidden = list(self.forbidden)
        if not srv.inside_root_allowed:
            forbidden.append((self.in_marker, "the inside canary (no --schema-root on this server)"))
        with srv.seen_lock:
            seen, srv.seen = srv.seen, []
        for b in seen:
            text = b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else str(b)
            for needle, what in forbidden:
                i = text.find(needle)
                if i >= 0:
                    raise CaseFailure("LEAK: a response contains %s: ...%s..." %
                                      (what, short(text[max(0, i - 200):i + 100], 400)))
        return extra

    def good_path(self, srv):
        check(srv.proc.poll() is None, "the server process died (exit %s): %s" %
              (srv.proc.returncode, short(srv.log_tail(), 800)))
        t0 = time.monotonic()
        st, _, body = srv.request("GET", "/health", timeout=5)
        check(st == 200, "GET /health after the case: %s %s" % (st, short(body)))
        check(time.monotonic() - t0 < 5, "GET /health took %.1fs" % (time.monotonic() - t0))
        expect_ok(srv.post_xml(GOOD_SCHEMA, timeout=30), "known-good schema")
        j = expect_ok(srv.post_json("/v1/prompt", GOOD_PROMPT, timeout=30), "known-good prompt")
        check("text" in j, "known-good prompt without text: %s" % short(json.dumps(j)))
        j = expect_ok(srv.post_json("/v1/chat/completions", GOOD_CHAT, timeout=30),
                      "known-good chat")
        check(j.get("object") == "chat.completion", "known-good chat: %s" % short(json.dumps(j)))

    # -- running --------------------------------------------------------------------------------
    def run_case(self, name, srv, fn):
        if self.only and not any(o in name for o in self.only):
            return
        t0 = time.monotonic()
        why = None
        if not srv.alive():
            why = "server '%s' is not running: %s" % (srv.label, srv.start_error)
        else:
            try:
                fn(srv)
            except CaseFailure as e:
                why = str(e)
            except Exception as e:  # a harness error is a failure too, with its trace
                why = "harness exception %s: %s\n%s" % (type(e).__name__, e,
                                                        traceback.format_exc(limit=4))
            try:
                self.leak_scan(srv)
                self.good_path(srv)
            except CaseFailure as e:
                why = (why + "; then " if why else "") + str(e)
            except Exception as e:
                why = (why + "; then " if why else "") + "harness exception %s: %s" % (
                    type(e).__name__, e)
            if srv.proc.poll() is not None:
                why = (why or "") + " [server died with %s; restarted]" % srv.proc.returncode
                srv.restart()
        dt = time.monotonic() - t0
        if why is None:
            print("ok %s (%.1fs)" % (name, dt), flush=True)
        else:
            print("FAIL %s: %s" % (name, why.replace("\n", "\n    ")), flush=True)
        self.results.append((name, why))


def urlquote(s):
    out = []
    for ch in s.encode("utf-8"):
        c = chr(ch)
        if ch < 128 and (c.isalnum() or c in "-._~"):
            out.append(c)
        else:
            out.append("%%%02X" % ch)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Cases: module src


def src_schema(value, name="h"):
    return '<schema name="%s"><module name="m" src="%s"/></schema>' % (name, value)


def src_spellings(suite):
    """(case name, schema XML, body content type or None, inside-root file expected or None).

    The last field names the inside-root text a --schema-root server must return (200); None: the
    src is refused everywhere (4xx)."""
    sec = suite.secret
    rel_root_to_secret = "../secret/canary.txt"  # from ROOT
    c = []
    a = c.append
    # absolute and traversal
    a(("abs_etc_passwd", src_schema("/etc/passwd"), None, None))
    a(("abs_canary", src_schema(sec), None, None))
    a(("abs_inside_root", src_schema(suite.inside), None, None))  # strict: relative paths only
    a(("proc_self_environ", src_schema("/proc/self/environ"), None, None))
    a(("etc_hostname", src_schema("/etc/hostname"), None, None))
    a(("dotdot", src_schema(rel_root_to_secret), None, None))
    a(("dotdot_deep", src_schema("../../../../../../../../etc/passwd"), None, None))
    a(("dot_dotdot", src_schema("./../secret/canary.txt"), None, None))
    a(("a_dotdot_dotdot", src_schema("a/../../secret/canary.txt"), None, None))
    a(("sub_dotdot_dotdot", src_schema("sub/../../secret/canary.txt"), None, None))
    a(("pct_2e2e", src_schema("%2e%2e/secret/canary.txt"), None, None))
    a(("pct_2e2e_2f", src_schema("%2e%2e%2fsecret%2fcanary.txt"), None, None))
    a(("double_slash", src_schema("//etc/passwd"), None, None))
    a(("backslashes", src_schema("..\\secret\\canary.txt"), None, None))
    a(("backslash_abs", src_schema("\\etc\\passwd"), None, None))
    a(("file_url", src_schema("file:///etc/passwd"), None, None))
    a(("file_url_canary", src_schema("file://" + sec), None, None))
    a(("nul_charref", src_schema("ok.txt&#0;/../../secret/canary.txt"), None, None))
    a(("nul_charref_abs", src_schema("/etc/passwd&#0;"), None, None))
    a(("entity_slash_dec", src_schema("&#47;etc&#47;passwd"), None, None))
    a(("entity_slash_hex", src_schema("&#x2F;etc&#x2f;passwd"), None, None))
    a(("entity_dots", src_schema("&#46;&#46;/secret/canary.txt"), None, None))
    a(("entity_amp_lt", src_schema("&lt;/etc/passwd&gt;"), None, None))
    a(("home_tilde", src_schema("~/.bashrc"), None, None))
    a(("long_path", src_schema("a/" * 3000 + "x"), None, None))
    # quoting tricks that defeat a text filter
    a(("quote_gt_in_attr", '<schema name="h"><module name=\'a>\' src="/etc/passwd"/></schema>',
       None, None))
    a(("quote_gt_in_attr2",
       '<schema name="h"><module name="m" cache=\'true\' x=\'>\' src="/etc/passwd"/></schema>',
       None, None))
    a(("single_quotes", "<schema name='h'><module name='m' src='/etc/passwd'/></schema>",
       None, None))
    a(("newline_tab_eq", '<schema name="h"><module\n\tname="m"\n\tsrc\n\t=\n\t"/etc/passwd"/>'
       '</schema>', None, None))
    a(("spaces_eq", '<schema name="h"><module name="m" src = "/etc/passwd" /></schema>',
       None, None))
    a(("cr_lf_attr", '<schema name="h"><module\r\nname="m"\r\nsrc="/etc/passwd"/></schema>',
       None, None))
    a(("dup_attr", '<schema name="h"><module name="m" src="ok.txt" src="/etc/passwd"/></schema>',
       None, None))
    a(("dup_attr_rev", '<schema name="h"><module name="m" src="/etc/passwd" src="ok.txt"/>'
       '</schema>', None, None))
    a(("dup_name_attr", '<schema name="h"><module name="m" name="n" src="/etc/passwd"/></schema>',
       None, None))
    a(("ns_prefix", '<schema name="h" xmlns:x="urn:x"><module name="m" x:src="/etc/passwd"/>'
       '</schema>', None, None))
    a(("ns_prefix_ok", '<schema name="h" xmlns:x="urn:x"><module name="m" x:src="ok.txt"/>'
       '</schema>', None, None))
    a(("ns_default", '<schema xmlns="urn:promptcache" name="h"><module name="m" '
       'src="/etc/passwd"/></schema>', None, None))
    a(("ns_element", '<x:schema xmlns:x="urn:x" name="h"><x:module name="m" src="/etc/passwd"/>'
       '</x:schema>', None, None))
    a(("upper_SRC", '<schema name="h"><module name="m" SRC="/etc/passwd"/></schema>', None, None))
    a(("upper_MODULE", '<schema name="h"><MODULE name="m" src="/etc/passwd"/></schema>',
       None, None))
    a(("cdata_before", '<schema name="h"><![CDATA[x]]><!-- c --><module name="m" '
       'src="/etc/passwd"/></schema>', None, None))
    a(("comment_in_tag_area", '<schema name="h"><!--<module name="n">--><module name="m" '
       'src="/etc/passwd"/><!--</module>--></schema>', None, None))
    a(("pi_before", '<?xml version="1.0"?><?pi x?><schema name="h"><module name="m" '
       'src="/etc/passwd"/></schema>', None, None))
    a(("doctype_internal_entity",
       '<!DOCTYPE schema [<!ENTITY p "/etc/passwd">]><schema name="h"><module name="m" src="&p;"/>'
       '</schema>', None, None))
    a(("doctype_system_entity_src",
       '<!DOCTYPE schema [<!ENTITY p SYSTEM "file:///etc/passwd">]><schema name="h"><module '
       'name="m" src="&p;"/></schema>', None, None))
    a(("doctype_system_entity_text",
       '<!DOCTYPE schema [<!ENTITY p SYSTEM "file:///etc/passwd">]><schema name="h"><module '
       'name="m">&p;</module></schema>', None, None))
    a(("doctype_system_entity_canary",
       '<!DOCTYPE schema [<!ENTITY p SYSTEM "%s">]><schema name="h"><module name="m">&p;'
       '</module></schema>' % sec, None, None))
    a(("doctype_param_entity",
       '<!DOCTYPE schema [<!ENTITY %% p SYSTEM "file://%s"> %%p;]><schema name="h"><module '
       'name="m">x</module></schema>' % sec, None, None))
    a(("xinclude", '<schema name="h" xmlns:xi="http://www.w3.org/2001/XInclude"><module '
       'name="m"><xi:include href="/etc/passwd" parse="text"/></module></schema>', None, None))
    a(("xinclude_canary", '<schema name="h" xmlns:xi="http://www.w3.org/2001/XInclude"><module '
       'name="m"><xi:include href="%s" parse="text"/></module></schema>' % sec, None, None))
    a(("bom", "\ufeff" + src_schema("/etc/passwd"), None, None))
    a(("bom_utf16", None, "utf16", None))  # built in the case (UTF-16 body)
    a(("json_xml_escapes", json.dumps({"xml": src_schema("/etc/passwd")}).replace("/", "\\u002f"),
       "application/json", None))
    a(("json_xml_escapes_src", json.dumps({"xml": src_schema("/etc/passwd")})
       .replace("src", "\\u0073rc"), "application/json", None))
    a(("json_xml_plain", json.dumps({"xml": src_schema("../secret/canary.txt")}),
       "application/json", None))
    a(("json_xml_dup_key", '{"xml": "<schema name=\\"h\\"><module name=\\"m\\">x</module>'
       '</schema>", "xml": "%s"}' % src_schema("/etc/passwd").replace('"', '\\"'),
       "application/json", None))
    a(("symlink_file", src_schema("link.txt"), None, None))
    a(("symlink_relative", src_schema("rellink.txt"), None, None))
    a(("symlink_dir", src_schema("linkdir/canary.txt"), None, None))
    a(("symlink_dir_dotdot", src_schema("linkdir/../secret/canary.txt"), None, None))
    a(("fifo", src_schema("fifo"), None, None))
    a(("directory", src_schema("sub"), None, None))
    a(("directory_dot", src_schema("."), None, None))
    a(("empty_src", src_schema(""), None, None))
    a(("nested_module", '<schema name="h"><module name="outer">a<module name="inner" '
       'src="/etc/passwd"/></module></schema>', None, None))
    a(("nested_deeper", '<schema name="h"><module name="a"><module name="b"><user><module '
       'name="c" src="../secret/canary.txt"/></user></module></module></schema>', None, None))
    a(("union_member", '<schema name="h"><union><module name="a" src="/etc/passwd"/><module '
       'name="b">x</module></union></schema>', None, None))
    a(("union_scaffold_member", '<schema name="h"><union scaffold="a"><module name="a" '
       'src="link.txt"/><module name="b">x</module></union></schema>', None, None))
    a(("in_chat_tag", '<schema name="h"><system><module name="m" src="/etc/passwd"/></system>'
       '</schema>', None, None))
    a(("src_plus_text", '<schema name="h"><module name="m" src="/etc/passwd">x</module></schema>',
       None, None))
    # inside ROOT: a --schema-root server reads these (200, only that file's text); the others
    # refuse them (400)
    a(("inside_plain", src_schema("ok.txt"), None, "ok.txt"))
    a(("inside_dot", src_schema("./ok.txt"), None, "ok.txt"))
    a(("inside_sub_dotdot", src_schema("sub/../ok.txt"), None, "ok.txt"))
    a(("inside_sub", src_schema("sub/ok2.txt"), None, "sub/ok2.txt"))
    a(("inside_charref", src_schema("&#111;k.txt"), None, "ok.txt"))
    a(("inside_json", json.dumps({"xml": src_schema("ok.txt")}), "application/json", "ok.txt"))
    return c


def make_src_case(suite, xml, ctype, inside):
    def case(srv):
        srv.request("DELETE", "/v1/schemas/h", timeout=10)  # left by an earlier case
        body = xml
        content_type = ctype or "application/xml"
        if ctype == "utf16":
            body = ("\ufeff" + src_schema("/etc/passwd")).encode("utf-16-le")
            content_type = "application/xml"
        fifo = os.path.join(suite.root, "fifo")
        is_fifo = xml is not None and 'src="fifo"' in xml
        resp = srv.post_xml(body, timeout=8 if is_fifo else 20, content_type=content_type)
        if is_fifo:
            # A reader stuck in open() on the FIFO is released, so the rest of the run goes on.
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
                stuck = True
            except OSError:
                stuck = False
            check(resp[0] is not None, "no answer within 8 s for a FIFO src%s: %s" % (
                " (a reader was stuck on the FIFO)" if stuck else "", short(resp[2])))
        if inside and srv.inside_root_allowed:
            j = expect_ok(resp, "schema reading %s inside --schema-root" % inside)
            st, _, lay = srv.request("GET", "/v1/schemas/h", timeout=10)
            check(st == 200, "GET /v1/schemas/h: %s" % st)
            check(suite.in_marker.encode() in lay,
                  "the layout does not hold %s's text: %s" % (inside, short(lay)))
            srv.request("DELETE", "/v1/schemas/h", timeout=10)
            return
        if resp[0] == 200:
            srv.request("DELETE", "/v1/schemas/h", timeout=10)
        j = expect_error(resp, words=["src", "read", "file", "xml", "attribute", "entity",
                                      "doctype", "element", "include", "utf", "encoding",
                                      "path", "duplicate", "unknown", "name", "root"])
        # It must not have been registered either.
        st, _, lay = srv.request("GET", "/v1/schemas/h", timeout=10)
        check(st == 404, "a refused schema is listed: GET /v1/schemas/h gave %s: %s" %
              (st, short(lay)))
    return case


def schema_with_text_tricks(srv):
    """Comments and CDATA around tags in an otherwise plain schema: 200, the CDATA is text, and
    nothing is read."""
    xml = ('<schema name="h"><!-- <module name="x" src="/etc/passwd"/> --><module name="m">'
           '<![CDATA[<module name="y" src="/etc/passwd"/>]]></module></schema>')
    expect_ok(srv.post_xml(xml, timeout=20), "comment/CDATA schema")
    st, _, lay = srv.request("GET", "/v1/schemas/h", timeout=10)
    check(st == 200 and b'src=\\"/etc/passwd\\"' in lay,
          "the CDATA text is not the module's text: %s %s" % (st, short(lay)))
    srv.request("DELETE", "/v1/schemas/h", timeout=10)


def src_streamed_post(srv):
    """The default (streamed) POST /v1/schemas refuses a src before any stream starts."""
    srv.request("DELETE", "/v1/schemas/h", timeout=10)
    for value in ("/etc/passwd", "../secret/canary.txt", "link.txt"):
        resp = srv.post_xml(src_schema(value), stream=True, timeout=20)
        expect_error(resp, words=["src"])


def metrics_label_cardinality(srv):
    """Unknown paths and schema names do not grow /metrics (one label each, not one per path)."""
    st, _, before = srv.request("GET", "/metrics", timeout=10)
    check(st == 200, "GET /metrics: %s" % st)
    for i in range(300):
        srv.request("GET", "/nowhere-%d-%s" % (i, "x" * 50), timeout=10)
        if i % 3 == 0:
            srv.request("GET", "/v1/schemas/nope-%d" % i, timeout=10)
    st, _, after = srv.request("GET", "/metrics", timeout=10)
    check(b"nowhere-" not in after and b"nope-" not in after, "paths became labels")
    check(len(after) < len(before) + 4096, "/metrics grew from %d to %d bytes" %
          (len(before), len(after)))


def schema_name_traversal(srv):
    for path in ("/v1/schemas/..%2f..%2fetc%2fpasswd", "/v1/schemas/%2e%2e",
                 "/v1/schemas/..%2Fsecret%2Fcanary.txt", "/v1/schemas/%2Fetc%2Fpasswd"):
        resp = srv.request("GET", path, timeout=10)
        expect_error(resp, status=404)
    resp = srv.request("DELETE", "/v1/schemas/..%2f..%2fetc%2fpasswd", timeout=10)
    expect_error(resp, status=404)
    # A schema name that is a path, with --cache-dir absent: refused or harmless, never read.
    resp = srv.post_xml('<schema name="../../etc/passwd"><module name="m">x</module></schema>',
                        timeout=20)
    expect_error(resp, words=["name"])


def prompt_src(srv):
    """src in a prompt (not a schema) and in OpenAI module arguments."""
    resp = srv.post_json("/v1/prompt", {"prompt": '<prompt schema="hgood"><m src="/etc/passwd"/>'
                                                  '<user>hi</user></prompt>', "max_new_tokens": 2})
    expect_error(resp)
    resp = srv.post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "promptcache": {"schema": "hgood", "modules": [{"name": "m",
                                                        "arguments": {"src": "/etc/passwd"}}]}})
    expect_error(resp)
    resp = srv.post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "promptcache": {"schema": "../../etc/passwd", "modules": []}})
    expect_error(resp, lo=400, hi=404)


# ---------------------------------------------------------------------------------------------
# Cases: sizes and depth


def deep_json(depth, inner="1", open_="[", close="]"):
    return open_ * depth + inner + close * depth


def sizes_cases(suite):
    D = 100000
    chat = '{"messages": %s, "max_tokens": 2}'
    msgs_ok = '[{"role": "user", "content": "hi"}]'
    cases = []

    def json_case(path, body, words=None):
        def case(srv):
            resp = srv.post_json(path, body, timeout=30)
            expect_error(resp, status=400, words=words)
        return case

    depth_words = ["deep", "depth", "nest", "level"]
    cases.append(("json_deep_top_array", "/v1/chat/completions", deep_json(D), depth_words))
    cases.append(("json_deep_top_object", "/v1/chat/completions",
                  deep_json(D, "1", '{"a":', "}"), depth_words))
    cases.append(("json_deep_messages", "/v1/chat/completions", chat % deep_json(D), depth_words))
    cases.append(("json_deep_content", "/v1/chat/completions",
                  chat % ('[{"role": "user", "content": %s}]' % deep_json(D)), depth_words))
    cases.append(("json_deep_modules", "/v1/chat/completions",
                  '{"messages": %s, "max_tokens": 2, "promptcache": {"schema": "hgood", '
                  '"modules": %s}}' % (msgs_ok, deep_json(
                      D // 2, '{"name": "m"}', '[{"name": "m", "modules": ', "}]")), depth_words))
    cases.append(("json_deep_modules_list", "/v1/chat/completions",
                  '{"messages": %s, "max_tokens": 2, "promptcache": {"schema": "hgood", '
                  '"modules": %s}}' % (msgs_ok, deep_json(D)), depth_words))
    cases.append(("json_deep_arguments", "/v1/chat/completions",
                  '{"messages": %s, "max_tokens": 2, "promptcache": {"schema": "hgood", '
                  '"modules": [{"name": "m", "arguments": {"a": %s}}]}}' % (msgs_ok, deep_json(D)),
                  depth_words))
    cases.append(("json_deep_stop", "/v1/chat/completions",
                  '{"messages": %s, "max_tokens": 2, "stop": %s}' % (msgs_ok, deep_json(D)),
                  depth_words))
    cases.append(("json_deep_temperature", "/v1/chat/completions",
                  '{"messages": %s, "max_tokens": 2, "temperature": %s}' % (msgs_ok, deep_json(D)),
                  depth_words))
    cases.append(("json_deep_completion_prompt", "/v1/completions",
                  '{"prompt": %s, "max_tokens": 2}' % deep_json(D), depth_words))
    cases.append(("json_deep_pml_prompt", "/v1/prompt",
                  '{"prompt": %s, "max_new_tokens": 2}' % deep_json(D), depth_words))
    cases.append(("json_deep_prompt_stop", "/v1/prompt",
                  '{"prompt": "<prompt schema=\\"hgood\\"><user>hi</user></prompt>", '
                  '"max_new_tokens": 2, "stop": %s}' % deep_json(D), depth_words))
    cases.append(("json_deep_schema_body", "/v1/schemas?stream=false",
                  '{"xml": %s}' % deep_json(D), depth_words))
    cases.append(("json_depth_65", "/v1/chat/completions",
                  chat % ('[{"role": "user", "content": "hi", "x": %s}]' % deep_json(70)),
                  depth_words))
    out = [(n, json_case(p, b, w)) for n, p, b, w in cases]

    def numbers(srv):
        # 1e-400 underflows to 0, a valid value (checked below); 1e400 overflows.
        bad = [("temperature", "1e400"), ("temperature", "-1e400"),
               ("top_p", "1e400"), ("max_tokens", "1e400"),
               ("seed", "-1e400"), ("seed", "1e400"), ("top_k", "1e400"),
               ("temperature", '"NaN"'), ("temperature", '"nan"'), ("temperature", '"Infinity"'),
               ("temperature", '"-inf"'), ("temperature", "NaN"), ("temperature", "Infinity"),
               ("temperature", "-Infinity"), ("max_tokens", "18446744073709551616"),
               ("max_tokens", "9223372036854775808"), ("max_tokens", "1" + "0" * 30),
               ("max_tokens", "-1"), ("max_tokens", "2.5"), ("seed", "1" + "0" * 400),
               ("temperature", "1" + "0" * 400), ("max_tokens", "0" * 100000 + "1")]
        fails = []
        for field, value in bad:
            body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "%s": %s}' \
                % (field, value)
            if field == "max_tokens":
                body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %s}' % value
            try:
                expect_error(srv.post_json("/v1/chat/completions", body, timeout=30), status=400)
            except CaseFailure as e:
                fails.append("%s=%s: %s" % (field, short(value, 30), e))
        for field, value in [("temperature", "1e400"), ("max_new_tokens", "1e400"),
                             ("recompute", "NaN"),
                             ("max_new_tokens", "18446744073709551616")]:
            body = ('{"prompt": "<prompt schema=\\"hgood\\"><m/><user>hi</user></prompt>", '
                    '"max_new_tokens": 2, "%s": %s}' % (field, value))
            if field == "max_new_tokens":
                body = ('{"prompt": "<prompt schema=\\"hgood\\"><m/><user>hi</user></prompt>", '
                        '"max_new_tokens": %s}' % value)
            try:
                expect_error(srv.post_json("/v1/prompt", body, timeout=30), status=400)
            except CaseFailure as e:
                fails.append("/v1/prompt %s=%s: %s" % (field, value, e))
        # Underflow is no overflow: a temperature that reads as 0 is greedy, a valid value,
        # answered (a top_p that reads as 0 is outside (0, 1] and refused like 0 itself).
        expect_error(srv.post_json(
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "top_p": 1e-400}',
            timeout=30), status=400, words=["top-p", "top_p"])
        for field, value in [("temperature", "1e-400"),
                             ("temperature", "0." + "0" * 100000 + "1")]:
            body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "%s": %s}' \
                % (field, value)
            code, _, answer = srv.post_json("/v1/chat/completions", body, timeout=30)
            if code != 200:
                fails.append("%s=%s (underflows to 0): status %s %s" %
                             (field, short(value, 30), code, short(answer)))
        check(not fails, "; ".join(fails))
    out.append(("numbers_out_of_range", numbers))

    def huge_max_tokens(srv):
        # Beyond the context: refused (400) or clamped, but answered in bounded time.
        t0 = time.monotonic()
        resp = srv.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 9}, timeout=60)
        check(resp[0] in (200, 400), "status %s: %s" % (resp[0], short(resp[2])))
        if resp[0] == 400:
            expect_error(resp)
        check(time.monotonic() - t0 < 60, "took %.1fs" % (time.monotonic() - t0))
    out.append(("huge_max_tokens_1e9", huge_max_tokens))

    def many_messages(srv):
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
                for i in range(50000)]
        t0 = time.monotonic()
        resp = srv.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 2},
                             timeout=60)
        expect_error(resp, status=400)
        check(time.monotonic() - t0 < 30, "50,000 messages took %.1fs" % (time.monotonic() - t0))
    out.append(("messages_50000", many_messages))

    def stop_list(srv):
        stops = ["s%07d" % i + "x" * 92 for i in range(10000)]  # ~1 MB
        resp = srv.post_json("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "hi"}], "max_tokens": 2, "stop": stops}, timeout=60)
        expect_error(resp, status=400, words=["stop"])
        resp = srv.post_json("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "hi"}], "max_tokens": 2, "stop": "y" * (1 << 20)},
            timeout=60)
        expect_error(resp, status=400, words=["stop"])
        resp = srv.post_json("/v1/prompt", dict(GOOD_PROMPT, stop=stops), timeout=60)
        expect_error(resp, status=400, words=["stop"])
    out.append(("stop_1mb", stop_list))

    def long_strings(srv):
        # A 3 MB user message: past the tiny model's context, refused before the scheduler.
        t0 = time.monotonic()
        resp = srv.post_json("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "word " * 600000}], "max_tokens": 2}, timeout=60)
        expect_error(resp, status=400)
        resp = srv.post_json("/v1/completions", {"prompt": "word " * 600000, "max_tokens": 2},
                             timeout=60)
        expect_error(resp, status=400)
        check(time.monotonic() - t0 < 40, "took %.1fs" % (time.monotonic() - t0))
    out.append(("long_strings_3mb", long_strings))

    def xml_deep(srv):
        xml = '<schema name="h">' + '<module name="m">' * D + "x" + "</module>" * D + "</schema>"
        expect_error(srv.post_xml(xml, timeout=60), status=400, words=depth_words)
        pml = ('<prompt schema="hgood">' + "<m>" * D + "</m>" * D + "<user>hi</user></prompt>")
        expect_error(srv.post_json("/v1/prompt", {"prompt": pml, "max_new_tokens": 2},
                                   timeout=60), status=400, words=depth_words)
        xml = '<schema name="h"><module name="m">' + "<user>" * D + "</schema>"
        expect_error(srv.post_xml(xml, timeout=60), status=400)
    out.append(("xml_deep_100000", xml_deep))

    def xml_unterminated(srv):
        for xml in ('<schema name="h"><module name="m" ' + "a" * (3 << 20),
                    '<schema name="h"><module name="m" src="' + "a" * (3 << 20),
                    '<schema name="h"><module ' + 'a="b" ' * (500000),
                    '<schema name="h"><!--' + "x" * (3 << 20),
                    '<schema name="h"><![CDATA[' + "x" * (3 << 20),
                    '<schema name="h"><module name="m">' + "<" * (3 << 20)):
            expect_error(srv.post_xml(xml, timeout=60), status=400)
    out.append(("xml_unterminated_3mb", xml_unterminated))

    def xml_many_attrs(srv):
        xml = '<schema name="h"><module name="m" ' + " ".join(
            'a%d="x"' % i for i in range(200000)) + '>x</module></schema>'
        expect_error(srv.post_xml(xml, timeout=60), status=400)
    out.append(("xml_200000_attributes", xml_many_attrs))

    def xml_billion_laughs(srv):
        ents = '<!ENTITY a0 "lol">' + "".join(
            '<!ENTITY a%d "%s">' % (i, ("&a%d;" % (i - 1)) * 10) for i in range(1, 10))
        xml = '<!DOCTYPE schema [%s]><schema name="h"><module name="m">&a9;</module></schema>' % ents
        resp = srv.post_xml(xml, timeout=30)
        # Never a billion lols; and entity declarations, which the parser does not expand, are
        # refused rather than taken as the literal text "&a9;" (the stricter reading).
        check(resp[0] is not None and len(resp[2]) < 1 << 20,
              "status %s, %d bytes" % (resp[0], len(resp[2])))
        if resp[0] == 200:
            srv.request("DELETE", "/v1/schemas/h", timeout=10)
        expect_error(resp, words=["entity", "doctype"])
    out.append(("xml_billion_laughs", xml_billion_laughs))
    return out


def budget_body_cases(suite):
    out = []

    def over_body(srv):
        big = {"messages": [{"role": "user", "content": "x" * 100000}], "max_tokens": 2}
        expect_error(srv.post_json("/v1/chat/completions", big, timeout=30), status=413,
                     limit="max_body_bytes", words=["max-body-bytes"])
        xml = '<schema name="h"><module name="m">' + "y " * 50000 + "</module></schema>"
        expect_error(srv.post_xml(xml, timeout=30), status=413, limit="max_body_bytes",
                     words=["max-body-bytes"])
        expect_error(srv.post_json("/v1/prompt", dict(GOOD_PROMPT, prompt="z" * 70000),
                                   timeout=30), status=413, limit="max_body_bytes")
    out.append(("body_over_max_body_bytes", over_body))

    def announced_never_sent(srv):
        # Content-Length far over the limit, no body: answered (413) or closed in bounded time.
        s = socket.create_connection((HOST, srv.port), timeout=30)
        try:
            s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                       "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
                       % (HOST, srv.port)).encode())
            t0 = time.monotonic()
            ok, why = good_client_answers(srv)
            check(ok, "while a huge body was announced and not sent: " + why)
            data = read_event(s, b"\r\n\r\n", 25)
            srv.record(data)
            check(data.startswith(b"HTTP/1.1 413") or (not data and time.monotonic() - t0 < 25),
                  "neither a 413 nor a close within 25 s: %s" % short(data))
        finally:
            s.close()
    out.append(("content_length_announced_never_sent", announced_never_sent))

    def announced_413_before_body(srv):
        # The size is known from the header: the 413 need not wait for (or drain) the body.
        s = socket.create_connection((HOST, srv.port), timeout=15)
        try:
            s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                       "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
                       % (HOST, srv.port)).encode())
            t0 = time.monotonic()
            data = b""
            while time.monotonic() - t0 < 15 and b"\r\n\r\n" not in data:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                data += chunk
            srv.record(data)
            check(data.startswith(b"HTTP/1.1 413") or data.startswith(b"HTTP/1.0 413"),
                  "no 413 within %.0fs: %s" % (time.monotonic() - t0, short(data)))
            check(time.monotonic() - t0 < 3, "the 413 came after %.1fs (the server drained the "
                  "announced body until its read timeout)" % (time.monotonic() - t0))
        finally:
            s.close()
    out.append(("content_length_413_before_the_body", announced_413_before_body))

    def chunked_over(srv):
        # No Content-Length: a chunked body that grows past the limit (64 KB). The server must
        # stop reading it (413, or a close) instead of buffering it: it may take what the
        # socket buffers hold, not 64 MB.
        s = socket.create_connection((HOST, srv.port), timeout=15)
        data = b""
        sent_mb = 0
        try:
            s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                       "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                       % (HOST, srv.port)).encode() + extra_header_bytes(srv))
            chunk = b"x" * (1 << 20)
            framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            s.settimeout(2.0)
            for _ in range(64):
                try:
                    s.sendall(framed)
                except OSError:
                    break  # the server closed, or stopped reading
                sent_mb += 1
                if select.select([s], [], [], 0)[0]:
                    break  # it answered
            else:
                try:
                    s.sendall(b"0\r\n\r\n")
                except OSError:
                    pass
            data = read_event(s, b"}}", 10)
        finally:
            s.close()
        srv.record(data)
        check(sent_mb < 16, "the server read %d MB of a chunked body on --max-body-bytes 65536 "
              "(answer: %s)" % (sent_mb, short(data, 200)))
        # The server takes no chunked body at all (its size is unknown until it has been read):
        # 411 Length Required, before a byte of it is read.
        check(data[9:12] == b"411", "a chunked body: %s" % short(data))
        j = parse_json(data.split(b"\r\n\r\n", 1)[-1].strip())
        check(isinstance(j, dict) and "content-length" in
              str(j.get("error", {}).get("message", "")).lower(),
              "the 411 for a chunked body has no JSON error naming Content-Length: %s" %
              short(data))
    out.append(("chunked_body_over_limit", chunked_over))
    return out


# ---------------------------------------------------------------------------------------------
# Cases: protocol


def logprobs_fields(srv):
    """logprobs / top_logprobs / echo (issue 33): bad values are 400s naming the field; an
    evaluation harness's scoring request (echo, max_tokens 0, logprobs) answers 200 in the
    OpenAI shape; the server answers afterwards (run_case checks)."""
    msgs = '[{"role": "user", "content": "hi"}]'
    bad = [("/v1/completions", '{"prompt": "hi", "logprobs": 6}', "logprobs"),
           ("/v1/completions", '{"prompt": "hi", "logprobs": -1}', "logprobs"),
           ("/v1/completions", '{"prompt": "hi", "logprobs": 1e400}', "number"),
           ("/v1/completions", '{"prompt": "hi", "logprobs": 18446744073709551616}', "logprobs"),
           ("/v1/completions", '{"prompt": "hi", "logprobs": "5"}', "logprobs"),
           ("/v1/completions", '{"prompt": "hi", "logprobs": [5]}', "logprobs"),
           ("/v1/completions", '{"prompt": "hi", "echo": "yes"}', "echo"),
           ("/v1/completions", '{"prompt": "hi", "echo": true, "stream": true}', "echo"),
           ("/v1/completions", '{"prompt": "hi", "top_logprobs": 3}', "top_logprobs"),
           ("/v1/completions", '{"prompt": [1, 2, 999999999], "echo": true}', "prompt"),
           ("/v1/completions", '{"prompt": [1, -2], "echo": true}', "prompt"),
           ("/v1/completions", '{"prompt": [1, 2.5], "echo": true}', "prompt"),
           ("/v1/completions", '{"prompt": "hi", "echo": true, "promptcache": {"schema": "hgood"}}',
            "echo"),
           ("/v1/chat/completions", '{"messages": %s, "logprobs": 3}' % msgs, "logprobs"),
           ("/v1/chat/completions", '{"messages": %s, "top_logprobs": 3}' % msgs, "top_logprobs"),
           ("/v1/chat/completions", '{"messages": %s, "logprobs": true, "top_logprobs": 21}' % msgs,
            "top_logprobs"),
           ("/v1/chat/completions",
            '{"messages": %s, "logprobs": true, "top_logprobs": 99999999999999999999}' % msgs,
            "top_logprobs"),
           ("/v1/chat/completions", '{"messages": %s, "echo": true}' % msgs, "echo")]
    fails = []
    for path, body, word in bad:
        try:
            expect_error(srv.post_json(path, body, timeout=30), status=400, words=[word])
        except CaseFailure as e:
            fails.append("%s %s: %s" % (path, short(body.encode(), 80), e))
    check(not fails, "; ".join(fails))
    # The harness's request: context + continuation as the prompt, the continuation's
    # token_logprobs read back.
    j = expect_ok(srv.post_json("/v1/completions",
                                '{"prompt": "The quick brown fox jumps", "max_tokens": 0, '
                                '"echo": true, "logprobs": 5, "temperature": 0}', timeout=60),
                  "echo scoring")
    lp = j["choices"][0]["logprobs"]
    n = j["usage"]["prompt_tokens"]
    check(isinstance(lp, dict) and all(len(lp[k]) == n for k in
                                       ("tokens", "token_logprobs", "top_logprobs", "text_offset")),
          "logprobs lists are not one per prompt token: %s" % short(json.dumps(j).encode()))
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
          "the first prompt token has a logprob")
    check(all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:]),
          "token_logprobs are not log-probabilities: %s" % lp["token_logprobs"])
    check(all(isinstance(t, dict) and 1 <= len(t) <= 5 for t in lp["top_logprobs"][1:]),
          "top_logprobs are not maps of at most 5: %s" % short(json.dumps(lp).encode()))
    check(j["choices"][0]["text"] == "".join(lp["tokens"]), "echoed text is not its tokens")
    # Generation with logprobs, streamed: one entry per generated token, in the chunks.
    st, _, body = srv.post_json("/v1/chat/completions",
                                '{"messages": %s, "max_tokens": 3, "stream": true, '
                                '"logprobs": true, "top_logprobs": 20}' % msgs, timeout=60)
    check(st == 200, "streamed chat with logprobs: %s %s" % (st, short(body)))
    entries = 0
    for line in body.decode("utf-8", "replace").split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices", []):
            if c.get("logprobs"):
                for t in c["logprobs"]["content"]:
                    check(len(t["top_logprobs"]) == 20, "top_logprobs not 20 long")
                    entries += 1
    check(1 <= entries <= 3, "%d streamed logprob entries for at most 3 tokens" % entries)


def good_client_answers(srv, within=5.0):
    """A good client is answered while something else holds the server: (ok, why)."""
    t0 = time.monotonic()
    st, _, body = srv.request("GET", "/health", timeout=within)
    if st != 200:
        return False, "GET /health: %s %s after %.1fs" % (st, short(body), time.monotonic() - t0)
    st, _, body = srv.post_json("/v1/chat/completions", GOOD_CHAT, timeout=within)
    if st != 200:
        return False, "chat: %s %s after %.1fs" % (st, short(body), time.monotonic() - t0)
    dt = time.monotonic() - t0
    if dt > within:
        return False, "answered after %.1fs" % dt
    return True, ""


def slow_loris(n, seconds, served_meanwhile=True):
    """n connections send a header byte a second. Fewer than --http-threads: a good client is
    answered meanwhile. More (served_meanwhile=False): each holds a connection thread while it
    drips (cpp-httplib has no header deadline: docs/server.md, "Security", says to put a proxy
    with header timeouts in front), and once they are gone the server answers at once."""
    def case(srv):
        socks = []
        try:
            for _ in range(n):
                s = socket.create_connection((HOST, srv.port), timeout=5)
                s.setblocking(True)
                socks.append(s)
            header = ("GET /health HTTP/1.1\r\nHost: %s:%d\r\nX-Slow: %s\r\n" %
                      (HOST, srv.port, "a" * 40)).encode()
            results = []
            stop = threading.Event()

            def drip():
                i = 0
                while not stop.is_set() and i < min(len(header), seconds + 2):
                    for s in socks:
                        try:
                            s.send(header[i:i + 1])
                        except OSError:
                            pass
                    i += 1
                    stop.wait(1.0)

            th = threading.Thread(target=drip, daemon=True)
            th.start()
            time.sleep(min(3, seconds))
            if served_meanwhile:
                for _ in range(max(1, seconds // 3)):
                    results.append(good_client_answers(srv, within=5.0))
                    time.sleep(1)
            else:
                time.sleep(seconds)
            stop.set()
            th.join(timeout=5)
            if not served_meanwhile:
                for s in socks:
                    try:
                        s.close()
                    except OSError:
                        pass
                results.append(good_client_answers(srv, within=5.0))
            bad = [w for ok, w in results if not ok]
            check(not bad, "%d slow-loris connections: the good client was not answered: %s" %
                  (n, "; ".join(bad[:3])))
        finally:
            for s in socks:
                try:
                    s.close()
                except OSError:
                    pass
    return case


def incomplete_body_then_close(srv):
    for path, ctype in (("/v1/chat/completions", "application/json"),
                        ("/v1/schemas", "application/xml")):
        for _ in range(5):
            s = socket.create_connection((HOST, srv.port), timeout=5)
            s.sendall(("POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n"
                       "Content-Length: 5000\r\n\r\n{\"messages\": [" %
                       (path, HOST, srv.port, ctype)).encode())
            s.close()
    ok, why = good_client_answers(srv)
    check(ok, why)


def incomplete_body_held(srv):
    """A body announced and never finished while the connection stays open: the server answers
    or closes it in bounded time (its read timeout), and others are served meanwhile."""
    s = socket.create_connection((HOST, srv.port), timeout=30)
    try:
        s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: "
                   "application/json\r\nContent-Length: 5000\r\n\r\n{\"messages\": [" %
                   (HOST, srv.port)).encode())
        ok, why = good_client_answers(srv)
        check(ok, "while a body was held back: " + why)
        t0 = time.monotonic()
        data = b""
        s.settimeout(1.0)
        closed = False
        while time.monotonic() - t0 < 25:
            try:
                c = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
            if not c:
                closed = True
                break
            data += c
        srv.record(data)
        check(closed or data, "the server kept waiting for the body for 25 s")
        if data:
            check(data[9:10] == b"4", "answered a half body with: %s" % short(data))
    finally:
        s.close()


def many_connections(srv):
    # 150, not thousands: the listen backlog is small, so a burst costs 1 s SYN retransmits.
    for i in range(150):
        s = socket.create_connection((HOST, srv.port), timeout=5)
        if i % 3 == 1:
            s.sendall(b"GET /heal")
        elif i % 3 == 2:
            s.sendall(b"POST /v1/schemas HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99\r\n")
        if i % 5 == 0:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    ok, why = good_client_answers(srv)
    check(ok, why)


def http10_no_host(srv):
    data = srv.raw(b"GET /health HTTP/1.0\r\n\r\n", timeout=10)
    check(data.startswith(b"HTTP/1.") and data[9:12] == b"200", "GET /health: %s" % short(data))
    body = json.dumps(GOOD_CHAT).encode()
    data = srv.raw(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n%s\r\n" % (len(body), extra_header_bytes(srv)) + body,
                   timeout=20)
    check(data[9:12] == b"200", "POST chat over HTTP/1.0 without Host: %s" % short(data))
    data = srv.raw(b"GET /health\r\n\r\n", timeout=10)  # HTTP/0.9
    check(not data or data[9:10] == b"4" or data[9:12] == b"200",
          "HTTP/0.9 request: %s" % short(data))


def extra_header_bytes(srv):
    return b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in srv.headers.items())


def pipelined_garbage(srv):
    req = ("GET /health HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (HOST, srv.port)).encode()
    for junk in (b"\x00\xff\xfe GARBAGE \r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"GET /health HTTP/1.1\r\nHost: " + b"h" * 100000 + b"\r\n\r\n",
                 b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 20000 + b"\r\n",
                 b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: "
                 b"50\r\n\r\n{}",
                 b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"fffffffffffffffff\r\n",
                 b"\r\n" * 1000):
        data = srv.raw(req + junk, timeout=10)
        check(data[9:12] == b"200", "the good request before the garbage: %s" % short(data))
    ok, why = good_client_answers(srv)
    check(ok, why)


def invalid_utf8(srv):
    bodies = [
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 2}',
        b'{"messages": [{"role": "user", "content": "a\xc0\xafb"}], "max_tokens": 2}',
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 2}',
        b'{"messages": [{"role": "\xff", "content": "hi"}], "max_tokens": 2}',
        b'{"\xff\xfe": 1, "messages": [{"role": "user", "content": "hi"}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["\xff"], "max_tokens": 2}',
        b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
        b'{"messages": [{"role": "user", "content": "hi"}], "promptcache": {"schema": "\xff", '
        b'"modules": []}}',
        b'{"messages": [{"role": "user", "content": "hi"}], "promptcache": {"schema": "hgood", '
        b'"modules": ["\xff"]}}',
    ]
    fails = []
    for b in bodies:
        try:
            expect_error(srv.post_json("/v1/chat/completions", b, timeout=20), status=400)
        except CaseFailure as e:
            fails.append("%r: %s" % (b[:60], e))
    for b in (b'{"prompt": "<prompt schema=\\"hgood\\"><m/><user>\xff</user></prompt>", '
              b'"max_new_tokens": 2}',
              b'{"prompt": "<prompt schema=\\"\xff\\"><user>hi</user></prompt>"}',
              b'{"prompt": "<prompt schema=\\"hgood\\"><\xff/></prompt>"}'):
        try:
            expect_error(srv.post_json("/v1/prompt", b, timeout=20), status=400)
        except CaseFailure as e:
            fails.append("/v1/prompt %r: %s" % (b[:60], e))
    for x in (b'<schema name="\xff"><module name="m">x</module></schema>',
              b'<schema name="h"><module name="\xc0\xaf">x</module></schema>'):
        try:
            expect_error(srv.post_xml(x, timeout=20), status=400)
        except CaseFailure as e:
            fails.append("schema %r: %s" % (x[:60], e))
    check(not fails, "; ".join(fails))


# ---------------------------------------------------------------------------------------------
# Cases: browsers and names


def origin_foreign(srv):
    fails = []
    for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example",
                   "http://localhost.evil.example:%d" % srv.port, "file://",
                   "https://127.0.0.1:%d" % srv.port + ".evil.example",
                   "http://good.example.evil.example",
                   "http://good.example:8080"):
        for method, path, body, ctype in (
                ("POST", "/v1/chat/completions", json.dumps(GOOD_CHAT), "application/json"),
                ("POST", "/v1/prompt", json.dumps(GOOD_PROMPT), "application/json"),
                ("POST", "/v1/schemas?stream=false", GOOD_SCHEMA, "application/xml"),
                ("POST", "/v1/chat/completions", json.dumps(GOOD_CHAT), "text/plain"),
                ("DELETE", "/v1/schemas/hgood", None, None),
                ("GET", "/v1/schemas", None, None)):
            resp = srv.request(method, path, body, headers={"Origin": origin}, content_type=ctype,
                               timeout=20)
            try:
                if ctype == "text/plain" and resp[0] == 415:  # either refusal may come first
                    expect_error(resp, status=415)
                else:
                    expect_error(resp, status=403, etype="permission_error")
                check("access-control-allow-origin" not in resp[1],
                      "a refused origin got CORS headers: %s" % resp[1])
            except CaseFailure as e:
                fails.append("%s %s Origin %s: %s" % (method, path, origin, e))
    check(not fails, "; ".join(fails[:6]) + (" (+%d more)" % (len(fails) - 6)
                                             if len(fails) > 6 else ""))


def origin_https_own_host(srv):
    """`https://` + Host counts as the server's own origin too (docs/server.md, "Browsers, hosts
    and keys": the playground behind a TLS proxy that keeps Host); `https://` + another host is
    foreign."""
    code, _, body = srv.post_json("/v1/chat/completions", GOOD_CHAT,
                                  headers={"Origin": "https://127.0.0.1:%d" % srv.port},
                                  timeout=20)
    check(code == 200, "https:// + the server's own Host: status %s %s" % (code, short(body)))
    resp = srv.post_json("/v1/chat/completions", GOOD_CHAT,
                         headers={"Origin": "https://evil.example:%d" % srv.port}, timeout=20)
    expect_error(resp, status=403, etype="permission_error")


def duplicate_guard_headers(srv):
    """A Host or Origin header sent twice (one good, one foreign) is refused, either order."""
    body = json.dumps(GOOD_CHAT).encode()
    good_host = "Host: %s:%d" % (HOST, srv.port)
    fails = []
    for hdrs in ([good_host, "Host: evil.example"], ["Host: evil.example", good_host],
                 [good_host, "Origin: %s" % srv.origin(), "Origin: http://evil.example"],
                 [good_host, "Origin: http://evil.example", "Origin: %s" % srv.origin()]):
        req = ("POST /v1/chat/completions HTTP/1.1\r\n%s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\nConnection: close\r\n" % ("\r\n".join(hdrs), len(body))
               ).encode() + extra_header_bytes(srv) + b"\r\n" + body
        data = srv.raw(req, timeout=10)
        if data[9:10] != b"4":
            fails.append("%s: %s" % (hdrs, short(data, 120)))
    check(not fails, "duplicated guard headers were not refused: " + "; ".join(fails))


def origin_own_and_allowed(srv):
    resp = srv.post_json("/v1/chat/completions", GOOD_CHAT, headers={"Origin": srv.origin()})
    expect_ok(resp, "own origin %s" % srv.origin())
    resp = srv.post_json("/v1/chat/completions", GOOD_CHAT,
                         headers={"Origin": "http://localhost:%d" % srv.port,
                                  "Host": "localhost:%d" % srv.port})
    expect_ok(resp, "own origin http://localhost:%d" % srv.port)
    resp = srv.post_json("/v1/chat/completions", GOOD_CHAT,
                         headers={"Origin": "http://good.example"})
    expect_ok(resp, "--allowed-origins http://good.example")
    h = resp[1]
    check(h.get("access-control-allow-origin") == "http://good.example",
          "allowed origin without Access-Control-Allow-Origin: %s" % h)
    check("origin" in h.get("vary", "").lower(), "allowed origin without Vary: Origin: %s" % h)
    resp = srv.post_json("/v1/chat/completions", GOOD_CHAT,
                         headers={"Origin": "HTTP://GOOD.EXAMPLE"})
    expect_ok(resp, "allowed origin in upper case")
    # Preflight.
    resp = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://good.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"}, timeout=10)
    check(resp[0] == 204, "preflight from an allowed origin: %s %s" % (resp[0], short(resp[2])))
    h = resp[1]
    check(h.get("access-control-allow-origin") == "http://good.example", "preflight: %s" % h)
    allow_h = h.get("access-control-allow-headers", "").lower()
    for want in ("authorization", "x-api-key", "content-type"):
        check(want in allow_h, "preflight Allow-Headers lacks %s: %s" % (want, h))
    check("post" in h.get("access-control-allow-methods", "").lower(), "preflight: %s" % h)
    resp = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}, timeout=10)
    check(resp[0] == 403, "preflight from a foreign origin: %s %s" % (resp[0], short(resp[2])))
    check("access-control-allow-origin" not in resp[1], "foreign preflight: %s" % resp[1])


def content_types(srv):
    fails = []
    for path, body in (("/v1/chat/completions", json.dumps(GOOD_CHAT)),
                       ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2})),
                       ("/v1/prompt", json.dumps(GOOD_PROMPT)),
                       ("/v1/schemas?stream=false", GOOD_SCHEMA)):
        for ctype in ("text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x", "application/jsonx", "text/xml",
                      "application/json-patch+json", None):
            if ctype is None:
                resp = srv.request("POST", path, body, timeout=20)  # no Content-Type at all
            else:
                resp = srv.request("POST", path, body, content_type=ctype, timeout=20)
            try:
                expect_error(resp, status=415, words=["content-type", "content type"])
            except CaseFailure as e:
                fails.append("%s as %s: %s" % (path, ctype, e))
    # application/xml is for /v1/schemas only.
    resp = srv.request("POST", "/v1/chat/completions", json.dumps(GOOD_CHAT),
                       content_type="application/xml", timeout=20)
    try:
        expect_error(resp, status=415)
    except CaseFailure as e:
        fails.append("chat as application/xml: %s" % e)
    # Parameters and case are ignored.
    for ctype in ("application/json; charset=utf-8", "Application/JSON"):
        resp = srv.request("POST", "/v1/chat/completions", json.dumps(GOOD_CHAT),
                           content_type=ctype, timeout=20)
        if resp[0] != 200:
            fails.append("chat as %s: %s %s" % (ctype, resp[0], short(resp[2])))
    check(not fails, "; ".join(fails[:6]) + (" (+%d more)" % (len(fails) - 6)
                                             if len(fails) > 6 else ""))


def hosts(srv):
    fails = []
    for host in ("evil.example", "localhost.evil.example", "127.0.0.1.evil.example",
                 "evil.example:%d" % srv.port, "localhost.evil.example:%d" % srv.port,
                 "LOCALHOST.evil.example", "10.0.0.1", "good.host.evil.example",
                 "127.0.0.1@evil.example", "evil.example#127.0.0.1"):
        for method, path, body, ctype in (
                ("POST", "/v1/chat/completions", json.dumps(GOOD_CHAT), "application/json"),
                ("GET", "/v1/schemas", None, None), ("GET", "/", None, None)):
            resp = srv.request(method, path, body, headers={"Host": host}, content_type=ctype,
                               timeout=20)
            try:
                expect_error(resp, status=403, etype="permission_error")
            except CaseFailure as e:
                fails.append("%s %s Host %r: %s" % (method, path, host, e))
    for host in ("localhost:%d" % srv.port, "127.0.0.1:%d" % srv.port, "localhost",
                 "[::1]:%d" % srv.port, "good.host", "good.host:%d" % srv.port,
                 "LocalHost:%d" % srv.port):
        resp = srv.post_json("/v1/chat/completions", GOOD_CHAT, headers={"Host": host},
                             timeout=20)
        if resp[0] != 200:
            fails.append("Host %r refused: %s %s" % (host, resp[0], short(resp[2])))
    check(not fails, "; ".join(fails[:6]) + (" (+%d more)" % (len(fails) - 6)
                                             if len(fails) > 6 else ""))


# ---------------------------------------------------------------------------------------------
# Cases: keys


def keys(suite):
    def case(srv):
        key = suite.api_key
        fails = []

        def want(resp, status, what):
            if resp[0] != status:
                fails.append("%s: %s (expected %d) %s" % (what, resp[0], status, short(resp[2])))
            elif status == 401:
                try:
                    expect_error(resp, status=401)
                except CaseFailure as e:
                    fails.append("%s: %s" % (what, e))

        want(srv.request("GET", "/v1/models", use_default_headers=False), 401, "no key")
        want(srv.post_json("/v1/chat/completions", GOOD_CHAT, use_default_headers=False), 401,
             "chat without a key")
        want(srv.request("GET", "/v1/models?api_key=" + key, use_default_headers=False), 401,
             "?api_key= on /v1/models")
        want(srv.request("GET", "/v1/schemas?api_key=" + key, use_default_headers=False), 401,
             "?api_key= on /v1/schemas")
        want(srv.post_json("/v1/chat/completions?api_key=" + key, GOOD_CHAT,
                           use_default_headers=False), 401, "?api_key= on chat")
        want(srv.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key + "x"},
                         use_default_headers=False), 401, "a wrong key")
        want(srv.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key[:-1]},
                         use_default_headers=False), 401, "a key prefix")
        want(srv.request("GET", "/v1/models", headers={"Authorization": key},
                         use_default_headers=False), 401, "the key without Bearer")
        want(srv.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key},
                         use_default_headers=False), 200, "Authorization: Bearer KEY")
        want(srv.request("GET", "/v1/models", headers={"X-API-Key": key},
                         use_default_headers=False), 200, "X-API-Key: KEY")
        want(srv.post_json("/v1/chat/completions", GOOD_CHAT, headers={"X-API-Key": key},
                           use_default_headers=False), 200, "chat with X-API-Key")
        want(srv.request("GET", "/health", use_default_headers=False), 200, "/health without key")
        # The key is not in ps.
        try:
            with open("/proc/%d/cmdline" % srv.proc.pid, "rb") as f:
                cmdline = f.read()
            if key.encode() in cmdline:
                fails.append("the key is in /proc/PID/cmdline: %s" % short(cmdline))
        except OSError as e:
            fails.append("cannot read /proc/PID/cmdline: %s" % e)
        ps = subprocess.run(["ps", "-eo", "args"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, timeout=10).stdout
        if key.encode() in ps:
            fails.append("the key is in ps output")
        # Nor in the playground page (with or without ?api_key=, which must not authorize
        # anything; the leak scan checks every response for the key).
        srv.request("GET", "/", timeout=10)
        srv.request("GET", "/?api_key=" + key, timeout=10, use_default_headers=False)
        if key.encode() in srv.log_text().encode():
            fails.append("the key is printed on stderr")
        check(not fails, "; ".join(fails))
    return case


# ---------------------------------------------------------------------------------------------
# Cases: budgets and cancellation


def max_schemas(srv):
    # hgood (the after-case check) is registered: one more fits, the next is refused.
    names = []
    try:
        got429 = None
        for i in range(5):
            name = "b%d" % i
            resp = srv.post_xml('<schema name="%s"><module name="m">x %d</module></schema>' %
                                (name, i), timeout=30)
            if resp[0] == 200:
                names.append(name)
                continue
            got429 = resp
            break
        check(got429 is not None, "5 more schemas on --max-schemas 2 were all accepted")
        check(len(names) == 1, "%d schemas were accepted beside hgood on --max-schemas 2" %
              len(names))
        expect_error(got429, status=429, limit="max_schemas", words=["--max-schemas"])
        # A schema of an existing name replaces it: no new slot needed.
        expect_ok(srv.post_xml('<schema name="b0"><module name="m">again</module></schema>',
                               timeout=30), "replacing a schema at the limit")
        # The 429 did not register anything.
        st, _, body = srv.request("GET", "/v1/schemas", timeout=10)
        j = parse_json(body) or {}
        listed = sorted(s.get("name") for s in j.get("schemas", []))
        check(listed == sorted(["hgood"] + names), "listed after the 429: %s" % listed)
    finally:
        for n in names + ["b%d" % i for i in range(5)]:
            srv.request("DELETE", "/v1/schemas/" + n, timeout=10)


def max_schema_positions(srv):
    """--max-schema-positions 600: a schema of about 900 positions is a 429 naming the limit."""
    text = " ".join("word%d" % (i % 97) for i in range(300))
    resp = srv.post_xml('<schema name="hpos"><module name="m">%s</module></schema>' % text,
                        timeout=30)
    if resp[0] == 200:
        srv.request("DELETE", "/v1/schemas/hpos", timeout=10)
    j = expect_error(resp, status=429, limit="max_schema_positions",
                     words=["--max-schema-positions"])
    st, _, _ = srv.request("GET", "/v1/schemas/hpos", timeout=10)
    check(st == 404, "the refused schema is registered: %s" % st)


def max_queue(srv):
    """--max-batch 1 --max-queue 2: one long generation runs, two wait, the rest are refused."""
    results = [None] * 14
    long_req = {"messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": 1500, "temperature": 1.0, "seed": 1}

    def go(i):
        body = long_req if i == 0 else {"messages": [{"role": "user", "content": "q%d" % i}],
                                        "max_tokens": 300, "temperature": 1.0, "seed": i}
        results[i] = srv.post_json("/v1/chat/completions", body, timeout=120)

    t0 = threading.Thread(target=go, args=(0,))
    t0.start()
    time.sleep(0.3)
    ths = [threading.Thread(target=go, args=(i,)) for i in range(1, 14)]
    for t in ths:
        t.start()
    for t in [t0] + ths:
        t.join(timeout=150)
    check(all(r is not None for r in results), "a request did not finish in 150 s")
    codes = [r[0] for r in results]
    n429 = [r for r in results if r[0] == 429]
    check(n429, "14 concurrent requests on --max-batch 1 --max-queue 2: no 429 (codes %s)" % codes)
    for r in n429:
        expect_error(r, status=429, limit="max_queue", words=["--max-queue"])
    check(all(c in (200, 429) for c in codes), "codes %s" % codes)


def big_union_schema(name, members, words_per_member):
    # Every member starts with the schema's name and a random salt, so no two big schemas share
    # a stored span (a shared span is not compiled again, and the compile would be instant).
    salt = "%s %08x" % (name, random.getrandbits(32))
    text = " ".join("word%d" % (i % 97) for i in range(words_per_member))
    return ('<schema name="%s"><union>' % name + "".join(
        '<module name="u%d">%s %d %s</module>' % (i, salt, i, text) for i in range(members)) +
        "</union></schema>")


class Calibration:
    members = None
    est_s = None
    words = 300


def calibrate(suite, srv):
    """Members of a union schema that compile for about 10 s (capped by the body size)."""
    # The good prompt these cases send needs the known-good schema.
    expect_ok(srv.post_xml(GOOD_SCHEMA, timeout=30), "known-good schema")
    if Calibration.members is not None:
        return Calibration.members
    words = Calibration.words
    n0 = 24
    t0 = time.monotonic()
    resp = srv.post_xml(big_union_schema("hcal", n0, words), timeout=120)
    dt = max(time.monotonic() - t0, 0.01)
    srv.request("DELETE", "/v1/schemas/hcal", timeout=10)
    check(resp[0] == 200, "calibration schema: %s %s" % (resp[0], short(resp[2])))
    per = dt / n0
    member_bytes = len(big_union_schema("x", 1, words))
    cap = int(3.5e6 / member_bytes)
    Calibration.members = max(n0, min(cap, int(10.0 / per)))
    Calibration.est_s = Calibration.members * per
    print("note: a %d-member union compiles in about %.1fs (%.0f ms per member)" %
          (Calibration.members, Calibration.est_s, per * 1000), flush=True)
    return Calibration.members


def read_event(sock, want, timeout):
    """Reads the streamed response until `want` (bytes) appears; returns what was read."""
    data = b""
    deadline = time.monotonic() + timeout
    sock.settimeout(0.5)
    while time.monotonic() < deadline and want not in data:
        try:
            c = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not c:
            break
        data += c
    return data


def post_raw_schema(srv, xml):
    s = socket.create_connection((HOST, srv.port), timeout=30)
    body = xml.encode()
    s.sendall(("POST /v1/schemas HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/xml\r\n"
               "Content-Length: %d\r\n" % (HOST, srv.port, len(body))).encode() +
              extra_header_bytes(srv) + b"\r\n" + body)
    return s


def cancel_on_disconnect(suite):
    def case(srv):
        members = calibrate(suite, srv)
        xml = big_union_schema("hbig", members, Calibration.words)
        s = post_raw_schema(srv, xml)
        try:
            data = read_event(s, b'"accepted"', 30)
            srv.record(data)
            check(b'"accepted"' in data, "no accepted event: %s" % short(data))
        finally:
            s.close()
        t0 = time.monotonic()
        bound = max(3.0, min(5.0, Calibration.est_s / 3))
        resp = srv.post_json("/v1/prompt", GOOD_PROMPT, timeout=60)
        dt = time.monotonic() - t0
        expect_ok(resp, "the good prompt after the client went away")
        check(dt < bound, "the good prompt waited %.1fs after the compiling client went away "
              "(the compile takes about %.1fs; bound %.1fs)" % (dt, Calibration.est_s, bound))
        time.sleep(0.5)
        st, _, body = srv.request("GET", "/v1/schemas/hbig", timeout=10)
        if st == 200:
            srv.request("DELETE", "/v1/schemas/hbig", timeout=30)
        check(st == 404, "the cancelled schema is registered: %s" % st)
    return case


def delete_while_compiling(suite):
    def case(srv):
        members = calibrate(suite, srv)
        xml = big_union_schema("hdel", members, Calibration.words)
        s = post_raw_schema(srv, xml)
        try:
            data = read_event(s, b'"accepted"', 30)
            check(b'"accepted"' in data, "no accepted event: %s" % short(data))
            t0 = time.monotonic()
            resp = srv.request("DELETE", "/v1/schemas/hdel", timeout=30)
            dt = time.monotonic() - t0
            check(resp[0] == 200, "DELETE of a compiling schema: %s %s" % (resp[0],
                                                                         short(resp[2])))
            check(dt < 5, "DELETE of a compiling schema took %.1fs" % dt)
            rest = read_event(s, b"\r\n0\r\n\r\n", 10)
            data += rest
            srv.record(data)
            tail = data.decode("utf-8", "replace")
            check("\r\n0\r\n\r\n" in tail, "the compile's stream did not end within 10 s of the "
                  "DELETE: ...%s" % short(tail[-300:]))
            check('"error"' in tail and '"done"' not in tail,
                  "the compile's stream did not end with an error: ...%s" % short(tail[-400:]))
        finally:
            s.close()
        t0 = time.monotonic()
        expect_ok(srv.post_json("/v1/prompt", GOOD_PROMPT, timeout=60), "good prompt after")
        check(time.monotonic() - t0 < 5, "the good prompt took %.1fs" % (time.monotonic() - t0))
        st, _, _ = srv.request("GET", "/v1/schemas/hdel", timeout=10)
        if st == 200:
            srv.request("DELETE", "/v1/schemas/hdel", timeout=30)
        check(st == 404, "the deleted schema is registered: %s" % st)
    return case


def max_compiles(suite):
    """Three big compiles at once on --max-compiles 2 (the default): the third is a 429."""
    def case(srv):
        members = calibrate(suite, srv)
        socks = []
        try:
            s = post_raw_schema(srv, big_union_schema("hc0", members, Calibration.words))
            socks.append(s)
            check(b'"accepted"' in read_event(s, b'"accepted"', 30), "compile hc0 not accepted")
            # The second waits behind the first (its accepted event comes when it starts).
            socks.append(post_raw_schema(srv, big_union_schema("hc1", members,
                                                               Calibration.words)))
            time.sleep(2.0)
            resp = srv.post_xml('<schema name="hc2"><module name="m">x</module></schema>',
                                timeout=30)
            expect_error(resp, status=429, limit="max_compiles", words=["--max-compiles"])
        finally:
            for s in socks:
                s.close()
        time.sleep(1)
        for i in range(3):
            srv.request("DELETE", "/v1/schemas/hc%d" % i, timeout=30)
    return case


# ---------------------------------------------------------------------------------------------


def main(argv):
    if len(argv) < 2:
        print("usage: hostile_clients.py PROMPTCACHE_CLI [--only SUBSTR[,SUBSTR]] [--keep]")
        return 2
    only = None
    if "--only" in argv:
        only = argv[argv.index("--only") + 1].split(",")
    suite = Suite(argv[1], only=only, keep="--keep" in argv)
    print("hostile clients: %s, work dir %s" % (suite.cli, suite.tmp), flush=True)

    def on_signal(signum, frame):
        suite.cleanup()
        sys.exit(3)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        suite.plant()
        suite.make_model()
        suite.start_servers()
        P, R, K, B = suite.plain, suite.rooted, suite.keyed, suite.budget

        # module src, without and with --schema-root
        for name, xml, ctype, inside in src_spellings(suite):
            suite.run_case("src_%s" % name, P, make_src_case(suite, xml, ctype, inside))
            suite.run_case("root_src_%s" % name, R, make_src_case(suite, xml, ctype, inside))
        suite.run_case("schema_comment_cdata_text", P, schema_with_text_tricks)
        suite.run_case("root_schema_comment_cdata_text", R, schema_with_text_tricks)
        suite.run_case("schema_name_traversal", P, schema_name_traversal)
        suite.run_case("src_streamed_post", P, src_streamed_post)
        suite.run_case("root_src_streamed_post", R, src_streamed_post)
        suite.run_case("metrics_label_cardinality", P, metrics_label_cardinality)
        suite.run_case("prompt_src", P, prompt_src)
        suite.run_case("root_prompt_src", R, prompt_src)

        # sizes and depth
        for name, fn in sizes_cases(suite):
            suite.run_case(name, P, fn)
        for name, fn in budget_body_cases(suite):
            suite.run_case(name, B, fn)

        suite.run_case("logprobs_echo_fields", P, logprobs_fields)

        # protocol
        suite.run_case("slow_loris_8", P, slow_loris(8, 8))
        suite.run_case("incomplete_body_then_close", P, incomplete_body_then_close)
        suite.run_case("incomplete_body_held_open", P, incomplete_body_held)
        suite.run_case("many_connections_dropped", P, many_connections)
        suite.run_case("http10_without_host", P, http10_no_host)
        suite.run_case("pipelined_garbage", P, pipelined_garbage)
        suite.run_case("invalid_utf8", P, invalid_utf8)

        # browsers and names
        suite.run_case("origin_foreign_403", P, origin_foreign)
        suite.run_case("origin_allowed_cors_preflight", P, origin_own_and_allowed)
        suite.run_case("origin_https_own_host", P, origin_https_own_host)
        suite.run_case("duplicate_host_origin_headers", P, duplicate_guard_headers)
        suite.run_case("content_type_415", P, content_types)
        suite.run_case("host_header_403", P, hosts)

        # keys
        suite.run_case("api_key_file", K, keys(suite))
        suite.run_case("key_origin_foreign_403", K, origin_foreign)
        suite.run_case("key_src_abs", K, make_src_case(suite, src_schema("/etc/passwd"), None,
                                                       None))

        # budgets and cancellation
        suite.run_case("max_schemas_429", B, max_schemas)
        suite.run_case("max_schema_positions_429", B, max_schema_positions)
        suite.run_case("max_queue_429", B, max_queue)
        suite.run_case("cancel_compile_on_disconnect", P, cancel_on_disconnect(suite))
        suite.run_case("delete_while_compiling", P, delete_while_compiling(suite))
        suite.run_case("max_compiles_429", P, max_compiles(suite))

        # the real slow-loris: more slow connections than --http-threads (64)
        suite.run_case("slow_loris_70_over_http_threads_recovers", P,
                       slow_loris(70, 10, served_meanwhile=False))
    finally:
        suite.cleanup()
    failed = [n for n, why in suite.results if why]
    print("run time %.0fs" % (time.monotonic() - T_START), flush=True)
    print("%d passed, %d failed" % (len(suite.results) - len(failed), len(failed)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
