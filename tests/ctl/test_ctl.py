# SPDX-License-Identifier: MIT
"""
kvarena-ctl's picture of the arena (map --svg / --html) and its live view
(top), against a real kvarena-agent and a real worker process in known
states (ctl_fixture.c). What the picture says is compared block by block
with what the library says (ctl_fixture dump: kva_arena_block_states) and
with kvarena-ctl's own map and status.

Run by meson (tests/ctl/meson.build) with the paths of the binaries in
KVA_AGENT, KVA_CTL and KVA_CTL_FIXTURE.
"""
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

AGENT = os.environ.get("KVA_AGENT", "")
CTL = os.environ.get("KVA_CTL", "")
FIXTURE = os.environ.get("KVA_CTL_FIXTURE", "")
NS = "{http://www.w3.org/2000/svg}"
BLOCKS = 512
ARENA_NAME = "ctl <&'\"> arena"
# the fixture's names as the picture must show them: printable UTF-8 kept,
# everything else '?' (U+FFFF, which XML does not allow, too)
NAME_A = "a<&\"'>\u00e9\u20ac?"
NAME_B = "?[2Jctl?<b>"
# ... and as JSON and the terminal show them (U+FFFF is printable to both)
NAME_A_TEXT = "a<&\"'>\u00e9\u20ac\uffff"
SLOT_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL"
# enum kva_block_kind, KVA_BLOCK_PINNED
FREE, OWNED, SHARED, CACHED, DEMOTING, FETCHING, BAD = range(7)
PINNED = 1

# meson test sets all three: without them this is a broken run, not a pass
if not (AGENT and CTL and FIXTURE):
    raise RuntimeError("KVA_AGENT, KVA_CTL, KVA_CTL_FIXTURE not set: run through meson test")


def ctl(sock, *args, check=True, timeout=30):
    r = subprocess.run([CTL, "--socket", sock, *args], capture_output=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"kvarena-ctl {' '.join(args)}: exit {r.returncode}: "
                             f"{r.stderr.decode(errors='replace')}")
    return r


def ctl_json(sock, *args):
    return [json.loads(line) for line in ctl(sock, "--json", *args).stdout.splitlines()]


class Arena:
    """An agent of BLOCKS blocks and a fixture worker holding known blocks."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kva-ctl-")
        self.sock = os.path.join(self.dir, "agent.sock")
        self.log = open(os.path.join(self.dir, "agent.log"), "wb")
        self.agent = subprocess.Popen(
            [AGENT, "--socket", self.sock, "--name", ARENA_NAME, "--blocks", str(BLOCKS),
             "--block-tokens", "16", "--layers", "1", "--kv-heads", "1", "--head-dim", "8",
             "--dtype", "f16"], stdout=self.log, stderr=self.log)
        for _ in range(500):
            if os.path.exists(self.sock) and \
                    ctl(self.sock, "status", check=False).returncode == 0:
                break
            assert self.agent.poll() is None, "the agent exited"
            time.sleep(0.01)
        else:
            raise AssertionError("the agent did not start")
        self.fixture = subprocess.Popen([FIXTURE, "hold", self.sock], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        line = self.fixture.stdout.readline()
        assert line, "the fixture did not start"
        self.held = json.loads(line)

    def tell(self, what):
        self.fixture.stdin.write(what + "\n")
        self.fixture.stdin.flush()
        answer = json.loads(self.fixture.stdout.readline())
        assert answer["ok"], what
        return answer

    def states(self):
        r = subprocess.run([FIXTURE, "dump", self.sock], capture_output=True, text=True,
                           timeout=30, check=True)
        states = [json.loads(line) for line in r.stdout.splitlines()]
        assert [s["id"] for s in states] == list(range(BLOCKS))
        return states

    def close(self):
        if self.fixture.poll() is None:
            try:
                self.fixture.stdin.write("quit\n")
                self.fixture.stdin.flush()
                self.fixture.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.fixture.kill()
                self.fixture.wait()
        self.agent.terminate()
        try:
            self.agent.wait(10)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            self.agent.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def arena():
    a = Arena()
    yield a
    a.close()


def drawn(s):
    """The state a block is drawn in (agent/ctl_pvt.h: ctl_state), and its slot."""
    kind, pinned = s["kind"], s["flags"] & PINNED
    if kind == OWNED:
        return ("pinned", None) if pinned else ("owned", s["slot"])
    if kind == SHARED:
        return ("pinned", None) if pinned else ("shared", None)
    return ({FREE: "free", CACHED: "cached", DEMOTING: "demoting", FETCHING: "fetching"}
            .get(kind, "corrupt"), None)


def map_char(s):
    """kvarena-ctl map's character for a block: the same classifier."""
    return {FREE: ".", SHARED: "#", CACHED: "+", DEMOTING: "v", FETCHING: "^"}.get(
        s["kind"], SLOT_CHARS[s["slot"]] if s["kind"] == OWNED else "!")


def cell_key(state, slot):
    return (state, int(slot) if slot is not None else None)


def picture(arena, *args, html=False):
    path = os.path.join(arena.dir, "map.html" if html else "map.svg")
    r = ctl(arena.sock, "--json", "map", "--html" if html else "--svg", path, *args)
    summary = json.loads(r.stdout)
    with open(path, "rb") as f:
        raw = f.read()
    return raw, summary


def parse_svg(raw):
    root = ET.fromstring(raw)
    assert root.tag == NS + "svg"
    assert root.get("version") == "1.1"
    return root


def cells_of(root):
    return [e for e in root.iter(NS + "rect") if e.get("class") == "cell"]


def legend_of(root):
    out = {}
    for g in root.iter(NS + "g"):
        if g.get("class") != "legend":
            continue
        swatch = next(e for e in g.iter(NS + "rect") if e.get("class") == "swatch")
        text = "".join(next(g.iter(NS + "text")).itertext())
        out[cell_key(g.get("data-state"), g.get("data-slot"))] = (
            int(g.get("data-count")), swatch.get("fill"), text)
    return out


def totals_of(root):
    g = next(e for e in root.iter(NS + "g") if e.get("id") == "totals")
    return {k[5:]: int(v) for k, v in g.attrib.items() if k.startswith("data-")}


def check_against_status(sock, totals):
    st = ctl_json(sock, "status")[0]
    assert totals["total"] == st["total_blocks"] == BLOCKS
    assert totals["free"] == st["free_blocks"]
    assert totals["owned"] == st["owned_blocks"]
    assert totals["shared"] == st["shared_blocks"]
    assert totals["shared-refs"] == st["shared_refs"]
    assert totals["cached"] == st["prefix_cached_blocks"]
    return st


# ------------------------------------------------------------- the picture

def test_svg_one_cell_per_block_matches_the_arena(arena):
    raw, summary = picture(arena)
    root = parse_svg(raw)
    states = arena.states()
    cells = cells_of(root)
    h = arena.held
    # every block a cell, in order, in the state the library gives it
    assert len(cells) == BLOCKS == summary["cells"]
    assert summary["blocks_per_cell"] == 1
    assert [int(c.get("data-block")) for c in cells] == list(range(BLOCKS))
    for c, s in zip(cells, states):
        assert cell_key(c.get("data-state"), c.get("data-slot")) == drawn(s), (c.attrib, s)
    # ... which is what kvarena-ctl map (kva_arena_map) says too
    rows = "".join(ctl_json(arena.sock, "map")[0]["rows"])
    assert rows == "".join(map_char(s) for s in states)
    # the fixture's blocks, as it built them
    by_id = {int(c.get("data-block")): c for c in cells}
    for i in h["owned_a"]:
        assert cell_key(by_id[i].get("data-state"), by_id[i].get("data-slot")) == \
            ("owned", h["slot_a"])
    for i in h["owned_b"]:
        assert cell_key(by_id[i].get("data-state"), by_id[i].get("data-slot")) == \
            ("owned", h["slot_b"])
    assert all(by_id[i].get("data-state") == "shared" for i in h["shared"])
    assert all(by_id[i].get("data-state") == "cached" for i in h["cached"])
    assert len(h["pinned"]) == 4
    assert all(by_id[i].get("data-state") == "pinned" for i in h["pinned"])
    assert all(states[i]["pins"] == 1 for i in h["pinned"])
    # the first pinned block is held by both workers, the partial one owned
    assert states[h["pinned"][0]]["holders"] == 2
    assert states[h["pinned"][3]]["kind"] == OWNED
    # colors: each cell in its legend entry's color
    legend = legend_of(root)
    for c in cells:
        key = cell_key(c.get("data-state"), c.get("data-slot"))
        assert c.get("fill") == legend[key][1], key
        assert re.fullmatch(r"#[0-9a-f]{6}", c.get("fill"))
    fills = [legend[k][1] for k in legend]
    assert len(set(fills)) == len(fills), "two states share a color"
    # the legend counts every block once, as the cells are
    assert sum(n for n, _, _ in legend.values()) == BLOCKS
    for key, (n, _, _) in legend.items():
        assert n == sum(1 for c in cells
                        if cell_key(c.get("data-state"), c.get("data-slot")) == key), key
    assert legend[("owned", h["slot_a"])][0] == 7
    assert legend[("owned", h["slot_b"])][0] == 2
    assert legend[("shared", None)][0] == 3
    assert legend[("pinned", None)][0] == 4
    assert legend[("cached", None)][0] == 2
    assert legend[("free", None)][0] == BLOCKS - 18
    # the totals are kvarena-ctl status's
    totals = totals_of(root)
    check_against_status(arena.sock, totals)
    assert totals["pinned"] == 4 and totals["corrupt"] == 0
    assert summary["states"]["pinned"] == 4 and summary["pinned_blocks"] == 4
    assert summary["states"]["owned"] == 9 and summary["states"]["free"] == BLOCKS - 18


def test_svg_escapes_what_shared_memory_says(arena):
    raw, _ = picture(arena)
    root = parse_svg(raw)
    text = "".join(root.itertext())
    legend = legend_of(root)
    h = arena.held
    # names come out printable and escaped, and read back as they were
    assert NAME_A in legend[("owned", h["slot_a"])][2]
    assert NAME_B in legend[("owned", h["slot_b"])][2]
    assert ARENA_NAME in text
    assert root.find(NS + "title").text.endswith(ARENA_NAME)
    # ... escaped in the file, never raw
    assert b"a&lt;&amp;&quot;&#39;&gt;" in raw
    assert b"ctl &lt;&amp;&#39;&quot;&gt; arena" in raw
    assert b"\xef\xbf\xbf" not in raw
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", raw)
    # the text map (kva_arena_map_print) makes them safe for a terminal too
    r = ctl(arena.sock, "map")
    assert b"?[2Jctl?<b>" in r.stdout
    assert not re.search(rb"[\x00-\x09\x0b-\x1f\x7f]", r.stdout)
    # the header: geometry, backend, the time
    assert "512 blocks of" in text and "16 tokens" in text and "f16" in text
    assert "block-major" in text and "backend host" in text
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)


def test_svg_groups_blocks_past_the_cell_limit(arena):
    states = arena.states()
    for limit in (50, 100, 511):
        raw, summary = picture(arena, "--cells", str(limit))
        root = parse_svg(raw)
        cells = cells_of(root)
        group = -(-BLOCKS // limit)
        assert summary["blocks_per_cell"] == group
        assert len(cells) == -(-BLOCKS // group) == summary["cells"]
        first = 0
        for c in cells:
            n = int(c.get("data-blocks"))
            assert int(c.get("data-first")) == first
            # the mix is the blocks' own states, counted
            want = {}
            for s in states[first:first + n]:
                st, slot = drawn(s)
                k = f"owned/{slot}" if st == "owned" else st
                want[k] = want.get(k, 0) + 1
            got = dict((k, int(v)) for k, v in
                       (m.split(":") for m in c.get("data-mix").split()))
            assert got == want, (first, got, want)
            # drawn in the most common state of its blocks
            top = max(got.values())
            key = cell_key(c.get("data-state"), c.get("data-slot"))
            name = f"owned/{key[1]}" if key[0] == "owned" else key[0]
            assert got[name] == top
            first += n
        assert first == BLOCKS
        # the legend still counts blocks, not cells
        legend = legend_of(root)
        assert sum(n for n, _, _ in legend.values()) == BLOCKS
        check_against_status(arena.sock, totals_of(root))


def test_pinned_blocks_stop_being_pinned(arena):
    h = arena.held
    arena.tell("close-pinned")
    raw, summary = picture(arena)
    cells = {int(c.get("data-block")): c for c in cells_of(parse_svg(raw))}
    states = arena.states()
    assert summary["pinned_blocks"] == 0
    assert not any(s["flags"] & PINNED for s in states)
    # the first is still held by the other worker's match: shared now; the
    # other two full ones cached; the partial one free
    first, second, third, partial = h["pinned"]
    assert cells[first].get("data-state") == "shared"
    assert cells[second].get("data-state") == "cached"
    assert cells[third].get("data-state") == "cached"
    assert cells[partial].get("data-state") == "free"
    # evicted: a new life, nothing pinned, nothing cached
    before = states
    taken = arena.tell("evict")["taken"]
    assert taken == BLOCKS - 7 - 3 - 2 - 1  # all but what A and B still hold
    states = arena.states()
    assert not any(s["flags"] & PINNED for s in states)
    assert not any(s["kind"] == CACHED for s in states)
    for i in (second, third):
        assert states[i]["kind"] == FREE and states[i]["epoch"] != before[i]["epoch"]
    raw, summary = picture(arena)
    assert summary["states"]["pinned"] == 0 and summary["states"]["cached"] == 0
    check_against_status(arena.sock, totals_of(parse_svg(raw)))


class StrictHTML(HTMLParser):
    """Every element closed, in order (void elements aside)."""
    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags = [], [], {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> with {self.stack[-3:]} open")
        else:
            self.stack.pop()


def test_html_is_well_formed_and_self_contained(arena):
    raw, summary = picture(arena, html=True)
    assert summary["format"] == "html"
    root = ET.fromstring(raw)  # well-formed enough for an XML parser
    assert root.tag == "html"
    svg = root.find(".//" + NS + "svg")
    assert svg is not None and len(cells_of(svg)) == BLOCKS
    p = StrictHTML()
    p.feed(raw.decode("utf-8"))
    p.close()
    assert not p.errors and not p.stack, (p.errors, p.stack)
    assert "script" not in p.tags
    # nothing from elsewhere
    assert not re.search(rb"(src|href)\s*=", raw) and b"url(" not in raw
    # the tables: a row per state drawn, a row per worker
    text = "".join(root.itertext())
    assert NAME_A in text and NAME_B in text
    rows = {r.get("data-slot") for r in root.iter("tr") if r.get("data-slot") is not None}
    assert {str(arena.held["slot_a"]), str(arena.held["slot_b"])} <= rows
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", raw)


def test_picture_to_stdout_and_bad_flags(arena):
    r = ctl(arena.sock, "map", "--svg", "-")
    assert len(cells_of(parse_svg(r.stdout))) == BLOCKS
    r = ctl(arena.sock, "map", "--html", "-", "--cells", "64", "--width", "8")
    root = ET.fromstring(r.stdout)
    cells = cells_of(root.find(".//" + NS + "svg"))
    assert len(cells) == 64
    assert len({c.get("x") for c in cells}) == 8
    for bad in (["map", "--cells", "10"], ["top", "--svg", "x.svg"],
                ["map", "--svg", "a", "--html", "b"], ["map", "--svg"],
                ["map", "--svg", "x", "--rows", "3"], ["--json", "map", "--svg", "-"],
                ["top", "--interval", "0"], ["top", "--interval", "nan"],
                ["status", "--iterations", "2"], ["map", "--cells", "0", "--svg", "x"]):
        r = ctl(arena.sock, *bad, check=False)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
    # a file that cannot be written: said, exit 1, nothing left behind
    r = ctl(arena.sock, "map", "--svg", os.path.join(arena.dir, "no", "such.svg"),
            check=False)
    assert r.returncode == 1 and b"writing" in r.stderr


# --------------------------------------------------------------------- top

def test_top_prints_plain_lines_into_a_pipe(arena):
    t0 = time.monotonic()
    r = ctl(arena.sock, "top", "--iterations", "3", "--interval", "0.2")
    elapsed = time.monotonic() - t0
    assert 0.55 < elapsed < 10
    assert b"\x1b" not in r.stdout
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 3
    st = ctl_json(arena.sock, "status")[0]
    for line in lines:
        kv = {k: v[1:-1].replace('\\"', '"').replace("\\\\", "\\") if v.startswith('"') else v
              for k, v in re.findall(r'(\S+?)=("(?:[^"\\]|\\.)*"|\S*)', line)}
        assert kv["arena"] == ARENA_NAME
        assert kv["blocks"] == str(BLOCKS)
        assert kv["free"] == str(st["free_blocks"])
        assert kv["owned"] == str(st["owned_blocks"])
        assert kv["shared"] == str(st["shared_blocks"])
        assert kv["refs"] == str(st["shared_refs"])
        assert kv["cached"] == str(st["prefix_cached_blocks"])
        assert kv["pinned"] == "4" and kv["corrupt"] == "0"
        assert kv["workers"] == f"{st['workers']}/{st['max_workers']}"
        assert kv["agent"] == "running"
        # a still arena: nothing moves
        assert float(kv["hits/s"]) == 0 and float(kv["published/s"]) == 0
        assert kv["hit_ratio_now"] == "-"


def test_top_json_lines(arena):
    r = ctl(arena.sock, "--json", "top", "--iterations", "2", "--interval", "0.2")
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2
    st = ctl_json(arena.sock, "status")[0]
    ps = ctl_json(arena.sock, "prefix")[0]
    h = arena.held
    for o in lines:
        for k in ("total_blocks", "free_blocks", "owned_blocks", "shared_blocks",
                  "shared_refs", "prefix_cached_blocks", "cached_blocks", "workers"):
            assert o[k] == st[k], k
        assert o["hits"] == ps["hits"] and o["misses"] == ps["misses"]
        assert o["pinned_blocks"] == 4
        assert 0.15 < o["interval_s"] < 5
        assert o["rates"]["hits"] == 0 and o["hit_ratio_interval"] is None
        slots = {s["slot"]: s for s in o["slots"]}
        assert slots[h["slot_a"]]["name"] == NAME_A_TEXT
        assert slots[h["slot_b"]]["name"] == NAME_B
        assert slots[h["slot_a"]]["pinned"] == 4
        assert slots[h["slot_a"]]["open_seqs"] == 1
        assert slots[h["slot_b"]]["owned"] == 2


def default_signals():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_DFL)


def run_on_pty(args, actions, rows=30, cols=100, timeout=20):
    """kvarena-ctl on a pseudo-terminal of the given size: (output, the
    terminal's modes after it exited, the exit status). @actions: a list of
    (seconds to wait, callable(master fd, process)) done while it runs."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    before = termios.tcgetattr(slave)
    # as from an interactive shell: the signals it handles not inherited
    # ignored (kvarena-ctl keeps a signal ignored that it was started with)
    p = subprocess.Popen([CTL, *args], stdin=slave, stdout=slave, stderr=slave,
                         start_new_session=True, preexec_fn=default_signals)
    out = b""
    deadline = time.monotonic() + timeout
    pending = list(actions)
    start = time.monotonic()
    while time.monotonic() < deadline:
        if pending and time.monotonic() - start >= pending[0][0]:
            pending.pop(0)[1](master, p)
        r, _, _ = select.select([master], [], [], 0.05)
        if r:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
        elif p.poll() is not None and not pending:
            break
    status = p.wait(5)
    after = termios.tcgetattr(slave)
    os.close(slave)
    os.close(master)
    # the terminal's output processing made each newline CR LF
    return out.replace(b"\r\n", b"\n"), before, after, status


def test_top_on_a_terminal_draws_and_restores(arena):
    out, before, after, status = run_on_pty(
        ["--socket", arena.sock, "top", "--interval", "0.2"],
        [(1.0, lambda fd, p: os.write(fd, b"q"))], cols=150)
    assert status == 0
    assert out.startswith(b"\x1b[?1049h")                  # the alternate screen
    assert out.count(b"\x1b[H") >= 3                        # frames drawn over
    assert out.rstrip().endswith(b"\x1b[?25h\x1b[?1049l")  # and left, the cursor back
    assert b"\x1b[K" in out
    text = out.decode(errors="replace")
    assert f'arena "{ARENA_NAME}"' in text
    assert NAME_A_TEXT[:-1] in text and "q quits" in text
    # every line fits the window
    for frame in out.split(b"\x1b[H")[1:]:
        for line in re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", frame).split(b"\n"):
            assert len(line.decode(errors="replace")) <= 150
    # the terminal's modes are as they were (echo, canonical input)
    assert after[3] == before[3]
    assert after[3] & termios.ECHO and after[3] & termios.ICANON


def test_top_on_a_terminal_restores_on_signals(arena):
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        out, before, after, status = run_on_pty(
            ["--socket", arena.sock, "top", "--interval", "0.2"],
            [(0.7, lambda fd, p, sig=sig: p.send_signal(sig))])
        assert status == 0, sig
        assert out.startswith(b"\x1b[?1049h")
        assert out.rstrip().endswith(b"\x1b[?25h\x1b[?1049l"), sig
        assert after[3] == before[3], sig


def test_top_on_a_terminal_stops_and_comes_back(arena):
    seen = {}

    def state(p):
        with open(f"/proc/{p.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def stopped(fd, p):
        seen["state"] = state(p)
        p.send_signal(signal.SIGCONT)

    out, before, after, status = run_on_pty(
        ["--socket", arena.sock, "top", "--interval", "0.2"],
        [(0.6, lambda fd, p: p.send_signal(signal.SIGTSTP)), (1.2, stopped),
         (1.8, lambda fd, p: os.write(fd, b"q"))])
    assert status == 0
    assert seen["state"] == "T"  # stopped by ^Z ...
    # ... with the terminal put back first, and the screen taken again after
    leave, enter = b"\x1b[?25h\x1b[?1049l", b"\x1b[?1049h"
    assert out.count(enter) == 2 and out.count(leave) == 2
    assert out.index(leave) < out.rindex(enter)
    assert out.rstrip().endswith(leave)
    assert after[3] == before[3]


def test_top_on_a_terminal_with_iterations_leaves_the_last_frame(arena):
    out, before, after, status = run_on_pty(
        ["--socket", arena.sock, "top", "--interval", "0.2", "--iterations", "3"], [],
        rows=12, cols=60)
    assert status == 0
    assert b"\x1b[?1049h" not in out                        # the main screen
    assert out.count(b"\x1b[H") == 1 + 3                    # cleared once, 3 frames
    assert out.endswith(b"\x1b[0m\x1b[?25h\n")
    assert after[3] == before[3]
    last = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", out.split(b"\x1b[H")[-1])
    lines = last.decode(errors="replace").splitlines()
    # a small window: cut to its width and height
    assert all(len(x) <= 60 for x in lines)
    assert len([x for x in lines if x.strip()]) <= 12
