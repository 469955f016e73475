# SPDX-License-Identifier: MIT
"""Sequences: match across workers and processes, salts, fork, quotas,
max_tokens, the tiers' fetch, and what happens to unclosed sequences."""
from __future__ import annotations

import errno
import gc
import multiprocessing as mp
import time

import numpy as np
import pytest

import kvarena
import procs

CTX = mp.get_context("spawn")


def test_match_across_processes(agent, worker):
    w = worker
    g = w.info.geometry
    tokens = procs.prompt_of(1, 100)
    p = CTX.Process(target=procs.publish, args=(agent.socket, 1, 100, "m"))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    with w.open_seq(model="m") as s:
        assert s.match(tokens) == 96  # 6 full blocks of 16
        ids, n = s.block_table()
        assert n == 96 and len(ids) == 6 and ids.dtype == np.int32
        # the bytes are what the other process stored
        want, _ = procs.kv_of(tokens[:96], np.arange(96), g.kv_heads, g.head_dim, 1)
        kc, _ = w.kv_cache(1)
        got = kc[ids].astype(np.float32).transpose(0, 2, 1, 3).reshape(96, g.kv_heads, -1)
        np.testing.assert_allclose(got, want, atol=1e-3)
    hit, bad = procs.serve(w, tokens, "m")
    assert hit == 96 and bad == 0
    ps = w.prefix_stats()
    assert ps.hits >= 12 and ps.published >= 6 and 0 < ps.hit_ratio <= 1


def test_salts_isolate(worker):
    w = worker
    tokens = procs.prompt_of(2, 64)
    procs.serve(w, tokens, "model-a")
    for kw in (dict(model="model-b"), dict(model="model-a", adapter="lora"),
               dict(model="model-a", tenant=3), dict(model="model-a", kind="training", run_id=1)):
        with w.open_seq(**kw) as s:
            assert s.match(tokens) == 0, kw
    with w.open_seq(model="model-a") as s:
        assert s.match(tokens) == 64
    with w.open_seq(model="model-a", kind="pinned") as s:  # the kind is not in the salt
        assert s.match(tokens) == 64
    keys = kvarena.prefix_keys(tokens, 16, "model-a")
    assert len(keys) == 4 and len(set(keys)) == 4
    assert keys != kvarena.prefix_keys(tokens, 16, "model-a", tenant=3)


def test_reserve_append_slots_and_busy(worker):
    w = worker
    with w.open_seq(reserve_tokens=20) as s:
        assert len(s) == 0 and s.n_blocks == 2 and bool(s)
        slots = s.slots(0, 20)
        ids, _ = s.block_table()
        assert slots.dtype == np.int64 and slots[17] == ids[1] * 16 + 1
        s.append(np.arange(20, dtype=np.int32))
        assert len(s) == 20 and s.n_tokens == 20
        s.append(list(range(30)))            # reserves what is missing
        assert len(s) == 50 and s.n_blocks == 4
        with pytest.raises(kvarena.Busy):
            s.match([1, 2, 3])
        with pytest.raises(kvarena.InvalidArgument):
            s.slots(60, 10)
        assert "50 tokens in 4 blocks" in repr(s)
    assert s.closed and "closed" in repr(s)
    with pytest.raises(kvarena.Closed):
        s.append([1])
    s.close()


def test_fork_shares_blocks_and_copies_the_partial_one(worker):
    w = worker
    with w.open_seq(model="fork") as s:
        s.append(list(range(40)))          # 2 full blocks and 8 tokens
        with s.fork() as c:
            assert c.kind is s.kind and c.model == "fork"
            sid, _ = s.block_table()
            cid, n = c.block_table()
            assert n == 40 and np.array_equal(sid, cid)
            c.append([7])                  # the child copies the partial block first
            cid2, _ = c.block_table()
            assert np.array_equal(cid2[:2], sid[:2]) and cid2[2] != sid[2]
            st = w.stats()
            assert st.shared_blocks >= 2
        assert len(s) == 40


def test_quotas(make_agent):
    a = make_agent("--quota-inference", "4", "--quota-pinned", "2", "--tenant-quota", "7:3")
    with kvarena.attach(a.socket) as w:
        s = w.open_seq(reserve_tokens=64)  # 4 blocks: the whole quota
        s.reserve(64)                      # room past the length (0): nothing more
        with pytest.raises(kvarena.QuotaExceeded) as e:
            s.reserve(65)
        assert e.value.errno == errno.EDQUOT and "quota" in e.value.strerror
        s.append(list(range(64)))
        with pytest.raises(kvarena.QuotaExceeded):
            s.append([1])
        assert len(s) == 64
        with pytest.raises(kvarena.QuotaExceeded):
            w.open_seq(reserve_tokens=1)
        s.close()
        with pytest.raises(kvarena.QuotaExceeded):
            w.open_seq("pinned", reserve_tokens=33)
        with w.open_seq("pinned", reserve_tokens=32):
            pass
        with pytest.raises(kvarena.QuotaExceeded) as e:
            w.open_seq(tenant=7, reserve_tokens=49)
        assert "tenant" in e.value.strerror
        with w.open_seq(tenant=7, reserve_tokens=48):
            ps = w.prefix_stats()
            assert ps.quotas.inference == 4 and ps.quotas.pinned == 2
            assert ps.quotas.tenants == ((7, 3, 3),)
            assert ps.usage["inference"] == 3
        # training has no quota here
        with w.open_seq("training", run_id=5, reserve_tokens=200):
            pass


def test_max_tokens(worker):
    with worker.open_seq(max_tokens=32) as s:
        s.reserve(32)
        with pytest.raises(kvarena.TooLarge):
            s.reserve(33)
        with pytest.raises(kvarena.TooLarge):
            s.append(list(range(33)))
        assert len(s) == 0  # all or nothing


def test_no_space(make_agent):
    a = make_agent("--blocks", "16")
    with kvarena.attach(a.socket) as w:
        with w.open_seq() as s:
            with pytest.raises(kvarena.NoSpace):
                s.reserve(17 * 16)
            s.reserve(16 * 16)


def test_unclosed_sequences_are_closed(worker):
    w = worker
    s = w.open_seq(reserve_tokens=100)
    assert w.seq_stats().open_seqs == 1 and w.open_seqs == [s]
    del s
    gc.collect()
    w.stats()  # the next call closes what was dropped
    assert w.seq_stats().open_seqs == 0
    assert w.stats().used_blocks == 0


def test_match_tiers_and_fetch_from_the_host_tier(make_agent):
    a = make_agent("--blocks", "64", "--host-bytes", "8M")
    with kvarena.attach(a.socket) as w:
        g = w.info.geometry
        tokens = procs.prompt_of(5, 128)
        procs.serve(w, tokens, "tiers")             # 8 published blocks, then cached
        deadline = time.monotonic() + 10
        while w.tier_stats().backed < 8:            # the agent copies them below
            assert time.monotonic() < deadline, w.tier_stats()
            time.sleep(0.02)
        assert w.tier_stats().host.enabled
        ids = w.alloc(w.stats().free_blocks + w.stats().prefix_cached_blocks)  # evicts them
        w.free(ids)
        with w.open_seq(model="tiers") as s:
            m = s.match_tiers(tokens)
            assert m.tokens == 0 and m.below_tokens == 128 and m.below_host_tokens == 128
            r = s.fetch(timeout=5)
            assert r.fetched_tokens == 128 and r.tokens == 128 and r.failed_blocks == 0
            assert len(s) == 128
            ids, _ = s.block_table()
            want, _ = procs.kv_of(tokens, np.arange(128), g.kv_heads, g.head_dim, 0)
            kc, _ = w.kv_cache(0)
            got = kc[ids].astype(np.float32).transpose(0, 2, 1, 3).reshape(128, g.kv_heads, -1)
            np.testing.assert_allclose(got, want, atol=1e-3)
        with w.open_seq(model="tiers") as s:
            assert s.match(tokens) == 128               # back in the arena
            with pytest.raises((kvarena.NoData, kvarena.Busy)):
                s.fetch_start()
        assert w.tier_stats().fetched >= 8
