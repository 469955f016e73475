# SPDX-License-Identifier: MIT
"""Several Python worker processes on one agent: zero-copy views across
processes, prefixes shared at once, one SIGKILLed mid-work and reclaimed."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time

import numpy as np

import kvarena
import procs

CTX = mp.get_context("spawn")


def test_views_are_the_same_memory_across_processes(agent):
    here, there = CTX.Pipe()
    p = CTX.Process(target=procs.write_and_share, args=(agent.socket, there))
    p.start()
    with kvarena.attach(agent.socket, "reader") as w:
        assert here.poll(60)
        b = here.recv()
        w.share([b])                               # the writer shared it: we hold it too
        k, v = w.block_kv(b, 1)
        want = np.arange(k.size, dtype=np.float32).reshape(k.shape).astype(k.dtype)
        assert np.array_equal(k, want)             # written through the other's view
        v[1, 2, 3] = 42
        here.send("written")
        assert here.recv() == 42.0                 # read through the other's view
        here.send("done")
        p.join(30)
        assert p.exitcode == 0
        w.free([b])
    agent.wait_idle()


def test_processes_share_prefixes_and_one_is_killed(make_agent):
    a = make_agent("--blocks", "512")
    progress = [CTX.Value("i", 0) for _ in range(4)]
    results = CTX.Queue()
    survivors = [CTX.Process(target=procs.loop, args=(a.socket, i, 200, progress[i], results))
                 for i in range(3)]
    victim = CTX.Process(target=procs.loop, args=(a.socket, 9, 10**9, progress[3], results))
    for p in survivors + [victim]:
        p.start()
    deadline = time.monotonic() + 60
    while min(p.value for p in progress) < 10:      # everyone is serving
        assert time.monotonic() < deadline, "the workers made no progress"
        time.sleep(0.002)
    os.kill(victim.pid, signal.SIGKILL)             # in the middle of a request, likely
    victim.join(10)
    assert victim.exitcode == -signal.SIGKILL
    got = {}
    for _ in survivors:
        index, hits, total, bad = results.get(timeout=120)
        got[index] = (hits, total, bad)
    for p in survivors:
        p.join(30)
        assert p.exitcode == 0
    assert all(bad == 0 for _, _, bad in got.values()), got
    assert sum(h for h, _, _ in got.values()) > 0, "no prefix was reused"
    # the agent reclaimed the victim: every block free or a cached prefix
    st = a.wait_idle()
    assert st["used_blocks"] == 0 and st["owned_blocks"] == 0
    a.ctl("check")                                  # exits 0: the invariant holds
    check = json.loads(a.ctl("--json", "check").stdout.splitlines()[0])
    assert check["ok"] is True and check["index_bad"] == 0
    assert any("loop-9" in line and "died" in line and "reclaimed" in line
               for line in a.log.splitlines()), a.log
