# SPDX-License-Identifier: MIT
"""What the test's worker processes run (multiprocessing, 'spawn': each
process imports this module and attaches on its own)."""
from __future__ import annotations

import os
import time

import numpy as np

import kvarena


def kv_of(tokens: np.ndarray, positions: np.ndarray, kv_heads: int, head_dim: int,
          layer: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of tokens, a function of (token, position, layer) alone: any
    process computes the same, so a matched block can be checked."""
    t = tokens.astype(np.float32)[:, None, None]
    p = positions.astype(np.float32)[:, None, None]
    h = np.arange(kv_heads, dtype=np.float32)[None, :, None]
    d = np.arange(head_dim, dtype=np.float32)[None, None, :]
    k = np.sin(t * 0.013 + p * 0.007 + h * 0.5 + d * 0.01 + layer)
    v = np.cos(t * 0.011 - p * 0.003 + h * 0.25 - d * 0.02 + layer)
    return k.astype(np.float32), v.astype(np.float32)


def prompt_of(family: int, n: int, salt: int = 0) -> np.ndarray:
    """A prompt of family ``family``: its first n tokens are the same every time."""
    rng = np.random.default_rng(family * 7919 + 1)
    base = rng.integers(0, 32000, n).astype(np.int32)
    if salt:
        base[-1] = salt
    return base


def serve(w: kvarena.Worker, tokens: np.ndarray, model: str = "test") -> tuple[int, int]:
    """One request: match, check the matched blocks, reserve, store, append,
    decode one step, close. Returns (matched tokens, bad values)."""
    g = w.info.geometry
    bad = 0
    with w.open_seq(model=model) as s:
        hit = s.match(tokens)
        ids, _ = s.block_table()
        for layer in range(g.layers):
            want_k, _ = kv_of(tokens[:hit], np.arange(hit), g.kv_heads, g.head_dim, layer)
            kc, _ = w.kv_cache(layer)
            for j in range(hit // g.block_tokens):
                got = kc[ids[j]].astype(np.float32).transpose(1, 0, 2)
                ref = want_k[j * g.block_tokens:(j + 1) * g.block_tokens]
                bad += int(np.sum(np.abs(got - ref) > 1e-2))
        n = len(tokens)
        s.reserve(n - hit + 1)
        slots = s.slots(hit, n - hit)
        for layer in range(g.layers):
            k, v = kv_of(tokens[hit:], np.arange(hit, n), g.kv_heads, g.head_dim, layer)
            w.store_kv(layer, k, v, slots)
        s.append(tokens[hit:])
        q = np.ones((1, 2 * g.kv_heads, g.head_dim), np.float32)
        out = w.decode(0, q, kvarena.PageTable.from_seqs([s]))
        bad += int(not np.all(np.isfinite(out)))
    return hit, bad


def publish(socket: str, family: int, n: int, model: str) -> None:
    """Attach, serve one request of ``family`` (publishing its blocks), detach."""
    with kvarena.attach(socket, f"pub-{os.getpid()}") as w:
        serve(w, prompt_of(family, n), model)


def loop(socket: str, index: int, requests: int, progress, results) -> None:
    """Serve ``requests`` requests over a few shared prompt families; count
    progress (so the test knows when to kill) and report (hits, tokens, bad)."""
    rng = np.random.default_rng(index)
    hits = total = bad = 0
    with kvarena.attach(socket, f"loop-{index}") as w:
        for r in range(requests):
            family = int(rng.integers(0, 4))
            n = int(rng.integers(40, 120))
            tokens = prompt_of(family, 128)[:n].copy()
            tokens[-1] = r  # a private tail
            hit, b = serve(w, tokens)
            hits, total, bad = hits + hit, total + n, bad + b
            with progress.get_lock():
                progress.value += 1
            time.sleep(0.001)
    results.put((index, hits, total, bad))


def write_and_share(socket: str, conn) -> None:
    """Allocate a block, write it through a view, share it, hand its id over;
    then check what the other process wrote through its own view."""
    with kvarena.attach(socket, "writer") as w:
        [b] = w.alloc(1)
        k, v = w.block_kv(b, 1)
        k[...] = np.arange(k.size, dtype=np.float32).reshape(k.shape).astype(k.dtype)
        w.share([b])
        conn.send(b)
        assert conn.recv() == "written"
        conn.send(float(v[1, 2, 3]))
        assert conn.recv() == "done"
        w.free([b, b])
