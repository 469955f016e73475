# SPDX-License-Identifier: MIT
"""Attach, detach, blocks, views and stats against a real agent."""
from __future__ import annotations

import errno
import gc
import os
import selectors
import signal
import threading
import time

import numpy as np
import pytest

import kvarena
from conftest import run_python


def test_attach_and_detach_with_context_manager(agent):
    with kvarena.attach(agent.socket, "cm") as w:
        assert not w.closed
        assert w.socket == agent.socket and w.name == "cm" and w.pid == os.getpid()
        assert 0 <= w.slot < w.info.max_workers
        g = w.info.geometry
        assert (g.block_tokens, g.layers, g.kv_heads, g.head_dim) == (16, 2, 2, 64)
        assert g.dtype is kvarena.DType.F16 and g.layout is kvarena.Layout.BLOCK_MAJOR
        assert w.info.backend is kvarena.Backend.HOST and w.blocks == 256
        assert "slot" in repr(w) and "'cm'" in repr(w)
        st = agent.status()
        assert st["workers"] == 1
        workers = agent.ctl("--json", "workers").stdout
        assert '"cm"' in workers
    assert w.closed and "detached" in repr(w)
    w.detach()  # idempotent
    w.close()
    agent.wait_idle()


def test_detach_gives_everything_back(agent):
    w = kvarena.attach(agent.socket)
    ids = w.alloc(40)
    w.share(ids[:5])
    s = w.open_seq(model="m")
    s.reserve(100)
    s.append(list(range(50)))
    s2 = w.open_seq()
    s2.reserve(10)
    assert w.stats().used_blocks > 40
    w.detach()
    assert s.closed and s2.closed
    s.close()  # a no-op now
    st = agent.wait_idle()
    assert st["prefix_cached_blocks"] == 3  # 50 tokens: 3 full blocks published


def test_every_call_after_detach_raises_closed(agent):
    w = kvarena.attach(agent.socket)
    s = w.open_seq()
    w.detach()
    calls = [
        lambda: w.alloc(1), lambda: w.free([0]), lambda: w.share([0]),
        lambda: w.block_kv(0, 0), lambda: w.kv_cache(0), lambda: w.block_kv_ptr(0, 0),
        lambda: w.block_read(0), lambda: w.block_write(0, 0, b"x"), lambda: w.kv_desc(0),
        lambda: w.stats(), lambda: w.prefix_stats(), lambda: w.seq_stats(),
        lambda: w.tier_stats(), lambda: w.check(), lambda: w.map(), lambda: w.poll(),
        lambda: w.fileno(), lambda: w.open_seq(), lambda: w.set_cache(4),
        lambda: w.attach_times(), lambda: s.match([1]), lambda: s.reserve(1),
        lambda: s.append([1]), lambda: s.fork(), lambda: s.block_table(),
        lambda: s.fetch_start(), lambda: len(s),
        lambda: w.decode(0, np.zeros((1, 2, 64), np.float32),
                         kvarena.PageTable([0, 0], [], [0], 16)),
    ]
    for call in calls:
        with pytest.raises(kvarena.Closed) as e:
            call()
        assert e.value.errno == errno.EBADF
        assert isinstance(e.value, ValueError)


def test_alloc_free_share(worker):
    w = worker
    assert w.alloc(0) == []
    ids = w.alloc(10)
    assert len(set(ids)) == 10 and all(0 <= i < w.blocks for i in ids)
    w.share(ids[:3])                      # our own blocks become shared: two references
    st = w.stats()
    assert st.shared_blocks == 3 and st.owned_blocks >= 7
    w.free(ids)
    w.free(np.array(ids[:3], dtype=np.int64))  # the references share took
    with pytest.raises(kvarena.NotPermitted) as e:
        w.free(ids[:1])                   # double free
    assert e.value.errno == errno.EPERM and "not held" in e.value.strerror
    assert e.value.function == "kva_free"
    w.free([])                            # nothing
    ids = w.alloc(1)
    w.free(ids[0])                        # one int is fine
    with pytest.raises(kvarena.NoSpace) as e:
        w.alloc(w.blocks + 1)
    assert e.value.errno == errno.ENOSPC
    all_ids = w.alloc(w.blocks)           # the whole arena
    with pytest.raises(kvarena.NoSpace) as e:
        w.alloc(1)
    assert "free" in str(e.value)
    w.free(all_ids)


def test_share_across_workers_and_foreign_free(agent):
    with kvarena.attach(agent.socket, "a") as a, kvarena.attach(agent.socket, "b") as b:
        ids = a.alloc(2)
        with pytest.raises(kvarena.NotPermitted):
            b.share(ids[:1])              # a's exclusive block
        with pytest.raises(kvarena.NotPermitted):
            b.free(ids[:1])
        a.share(ids[:1])
        b.share(ids[:1])                  # now b holds it too
        assert a.stats().shared_refs == 2
        a.free(ids)
        a.free(ids[:1])
        k, _ = b.block_kv(ids[0], 0)      # still b's
        b.free(ids[:1])
    agent.wait_idle()


def test_views_are_zero_copy_and_shaped(worker):
    w = worker
    g, lay = w.info.geometry, w.info.layout
    b = w.alloc(2)
    k, v = w.block_kv(b[0], 1)
    assert k.shape == v.shape == (g.kv_heads, g.block_tokens, g.head_dim)
    assert k.dtype == np.float16 and k.flags.writeable
    assert k.strides == (lay.head_stride, lay.token_stride, 2)
    k[...] = np.arange(k.size, dtype=np.float16).reshape(k.shape)
    v[...] = -1
    # the same bytes through the library's copy (canonical order: layer 1 K after layer 0's K, V)
    raw = np.frombuffer(w.block_read(b[0], 2 * lay.page_bytes, lay.page_bytes), np.float16)
    assert np.array_equal(raw.reshape(k.shape), k)
    # and through the address the library gives
    kp, vp = w.block_kv_ptr(b[0], 1)
    assert kp != 0 and vp - kp == lay.page_bytes
    # the whole layer as a paged cache, indexed by block id
    kc, vc = w.kv_cache(1)
    assert kc.shape == (w.blocks, g.kv_heads, g.block_tokens, g.head_dim)
    assert np.array_equal(kc[b[0]], k) and np.all(vc[b[0]] == -1)
    kc[b[1], 0, 0, 0] = 7
    assert w.block_kv(b[1], 1)[0][0, 0, 0] == 7
    # a block written with block_write shows in the view
    w.block_write(b[1], 0, np.full(g.head_dim, 3, np.float16))
    assert np.all(w.block_kv(b[1], 0)[0][0, 0] == 3)
    w.free(b)


def test_views_outlive_detach_without_crashing(agent):
    w = kvarena.attach(agent.socket)
    [b] = w.alloc(1)
    k, v = w.block_kv(b, 0)
    k[:] = 2
    w.detach()
    # the view keeps its own mapping: still valid memory, not ours any more
    assert float(k[0, 0, 0]) == 2.0
    k[:] = 5
    del k, v
    gc.collect()
    agent.wait_idle()


def test_block_read_write(worker):
    w = worker
    bb = w.info.block_bytes
    [b] = w.alloc(1)
    data = os.urandom(bb)
    w.block_write(b, 0, data)
    assert w.block_read(b) == data
    assert w.block_read(b, 100, 10) == data[100:110]
    assert w.block_read(b, bb) == b""
    w.block_write(b, bb - 4, bytearray(b"tail"))
    assert w.block_read(b, bb - 4) == b"tail"
    w.block_write(b, 8, memoryview(b"mv"))
    buf = bytearray(4)
    assert w.block_read_into(b, buf, 6) == 4
    assert bytes(buf) == data[6:8] + b"mv"
    arr = np.zeros(8, np.uint8)
    w.block_read_into(b, arr)
    assert arr.tobytes() == data[:8]
    w.free([b])


def test_stats_and_reports(worker, agent):
    w = worker
    ids = w.alloc(5)
    st = w.stats()
    assert st.total_blocks == 256 and st.workers == 1
    assert st.free_blocks + st.used_blocks + st.cached_blocks + st.prefix_cached_blocks <= 256
    me = [s for s in st.slots if s.slot == w.slot]
    assert me and me[0].name == "pytest" and me[0].pid == os.getpid() and me[0].state == "live"
    assert me[0].owned >= 5
    ps = w.prefix_stats()
    assert ps.policy == "prefix" and ps.hit_ratio == 0.0
    ss = w.seq_stats()
    assert ss.open_seqs == 0
    ts = w.tier_stats()
    assert not ts.host.enabled and not ts.disk.enabled
    rep = w.check()
    assert rep.ok and rep.first_problem == "" and rep.first_bad_block is None
    m = w.map()
    assert len(m) == 256 and m.count(".") <= 256 - 5
    assert len(w.map(16)) == 16
    t = w.attach_times()
    assert t.total_ns > 0
    d = kvarena.as_dict(st)
    assert d["total_blocks"] == 256 and isinstance(d["slots"], list)
    w.free(ids)


def test_fileno_and_poll(make_agent):
    a = make_agent("--shutdown-grace", "5")
    w = kvarena.attach(a.socket)
    fd = w.fileno()
    assert fd >= 0
    w.poll()  # nothing
    sel = selectors.DefaultSelector()
    sel.register(w, selectors.EVENT_READ)  # fileno() makes it selectable
    assert sel.select(0) == []
    a.proc.send_signal(signal.SIGTERM)
    assert sel.select(5), "the agent's SHUTDOWN never came"
    with pytest.raises(kvarena.ShuttingDown) as e:
        w.poll()
    assert e.value.errno == errno.ESHUTDOWN
    with pytest.raises(kvarena.ShuttingDown):
        w.alloc(1)
    sel.close()
    w.detach()
    assert a.proc.wait(10) == 0


def test_agent_gone(make_agent):
    a = make_agent()
    w = kvarena.attach(a.socket)
    [b] = w.alloc(1)
    a.stop(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while True:
        try:
            w.poll()
        except kvarena.AgentGone as e:
            assert e.errno == errno.ECONNRESET
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # the memory keeps working without the agent
    k, _ = w.block_kv(b, 0)
    k[:] = 1
    w.free([b])
    w.detach()


def test_attach_errors(tmp_path, make_agent):
    with pytest.raises(kvarena.AgentNotFound) as e:
        kvarena.attach(str(tmp_path / "none.sock"))
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)
    assert isinstance(e.value, ConnectionRefusedError)
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.attach("")
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.attach("/tmp/a\0b")
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.attach("/tmp/x.sock", "n" * 32)
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.attach("/tmp/x.sock", "bell\a")
    with pytest.raises(TypeError):
        kvarena.attach(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kvarena.attach("/tmp/x.sock", 5)  # type: ignore[arg-type]
    a = make_agent("--max-workers", "2", "--max-slots-per-pid", "2")
    w1 = kvarena.attach(a.socket)
    w2 = kvarena.attach(a.socket)
    with pytest.raises((kvarena.NoSlots, kvarena.QuotaExceeded)) as e:
        kvarena.attach(a.socket)
    assert e.value.strerror  # the agent's reason
    w1.detach()
    w2.detach()
    with pytest.raises(TypeError):
        kvarena.Worker()


def test_default_socket_from_environment(agent):
    code = ("import kvarena; w = kvarena.attach(); print(w.socket, w.slot); "
            "assert kvarena.default_socket() == w.socket; w.detach()")
    r = run_python(code, env={"KVARENA_SOCKET": agent.socket})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(agent.socket)


def test_threads_share_one_worker(worker):
    w = worker
    errors = []

    def run():
        try:
            for _ in range(300):
                ids = w.alloc(3)
                w.share(ids[:1])
                w.free(ids)
                w.free(ids[:1])
                with w.open_seq() as s:
                    s.reserve(20)
                    s.append(list(range(20)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert w.check().ok


def test_fork_child_cannot_use_parents_worker(worker, agent):
    w = worker
    ids = w.alloc(2)
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every call refused, detach leaves the parent's slot alone
        code = 1
        try:
            try:
                w.alloc(1)
            except kvarena.Closed as e:
                if "forked" in str(e):
                    w.detach()
                    with kvarena.attach(agent.socket, "child") as c:
                        c.free(c.alloc(1))
                    code = 0
        finally:
            os.write(wr, bytes([code]))
            os._exit(code)
    os.close(wr)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\0"
    w.free(ids)  # the parent's worker is still whole
    assert w.stats().workers == 1


def test_cache_setting(worker):
    worker.set_cache(0)
    ids = worker.alloc(3)
    worker.free(ids)
    assert worker.stats().cached_blocks == 0
    with pytest.raises(kvarena.InvalidArgument):
        worker.set_cache(65537)
    worker.set_cache(16)


def test_observer(agent):
    with kvarena.observe(agent.socket) as o:
        assert o.agent.pid == agent.proc.pid and o.info.blocks == 256
        assert o.agent_state() == ("running", agent.proc.pid)
        with kvarena.attach(agent.socket) as w:
            ids = w.alloc(4)
            assert o.stats().used_blocks >= 4
            assert o.check().ok
            assert len(o.map()) == 256
            assert o.prefix_stats().open_seqs == 0
            assert o.seq_stats(w.slot).open_seqs == 0
            assert not o.tier_stats().host.enabled
            w.free(ids)
        assert "agent pid" in repr(o)
    assert o.closed
    with pytest.raises(kvarena.Closed):
        o.stats()
