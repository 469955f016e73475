#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A toy serving engine on kvarena: the pattern a vLLM or SGLang integration follows.

Several engine processes share one kvarena-agent's arena. Each takes requests
from a synthetic stream whose prompts start with a few shared system prompts,
and per batch of requests:

  match    attach the longest cached prefix any process already computed
  reserve  room for the rest of the prompt and the tokens to generate
  store    K/V of the unmatched prompt tokens, every layer, into the arena's blocks
  append   the prompt: its full blocks are published for every other process
  decode   one step for the whole batch (FlashInfer page table), store the new
           token's K/V, append it; repeat
  close    the blocks stay cached for the next match

The "model" is fake: K/V are a function of (token, position, layer), so any
process computes the same and a reused block can be checked; the next token
comes from the attention output. At the end each process prints how much of
its prompts it did not have to compute.

  python3 examples/engine.py --agent build/release/agent/kvarena-agent
  python3 examples/engine.py --socket /run/kvarena/kvarena.sock --processes 8
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    import kvarena
except ImportError:  # run from a checkout: the package is in python/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    import kvarena


def kv_of(tokens, positions, layer, heads, dim):
    """The fake model's K and V for tokens at positions: [n, heads, dim] each."""
    x = tokens[:, None, None] * 0.013 + positions[:, None, None] * 0.007
    x = x + np.arange(heads)[None, :, None] * 0.5 + np.arange(dim)[None, None, :] * 0.01 + layer
    return np.sin(x).astype(np.float32), np.cos(x).astype(np.float32)


def request_stream(seed, n, system_prompts, prompt_tokens):
    """Prompts = one of a few system prompts (a Zipf-like choice) + a user part."""
    rng = np.random.default_rng(seed)
    systems = [np.random.default_rng(1000 + i).integers(0, 32000, prompt_tokens)
               for i in range(system_prompts)]
    weights = 1.0 / np.arange(1, system_prompts + 1)
    for _ in range(n):
        system = systems[rng.choice(system_prompts, p=weights / weights.sum())]
        user = rng.integers(0, 32000, rng.integers(16, 96))
        yield np.concatenate([system, user]).astype(np.int32)


def engine(index, socket, args, results):
    """One engine process: attach (after the fork), serve batches, report."""
    with kvarena.attach(socket, f"engine-{index}") as w:
        g = w.info.geometry
        L, H, D, P = g.layers, g.kv_heads, g.head_dim, g.block_tokens
        prompt = reused = decoded = bad = 0
        start = time.monotonic()
        stream = list(request_stream(index, args.requests, args.prompts, args.prompt_tokens))
        for b in range(0, len(stream), args.batch):
            batch = stream[b:b + args.batch]
            seqs = [w.open_seq(model="toy-model") for _ in batch]
            for s, tokens in zip(seqs, batch):                   # prefill
                hit = s.match(tokens)
                ids, _ = s.block_table()
                want_k, _ = kv_of(tokens[:hit], np.arange(hit), 0, H, D)
                got_k = w.kv_cache(0)[0][ids[:hit // P]].transpose(0, 2, 1, 3)
                bad += int(np.abs(got_k.reshape(hit, H, D) - want_k).max(initial=0) > 1e-2)
                s.reserve(len(tokens) - hit + args.new_tokens)
                slots = s.slots(hit, len(tokens) - hit)
                for layer in range(L):
                    k, v = kv_of(tokens[hit:], np.arange(hit, len(tokens)), layer, H, D)
                    w.store_kv(layer, k.astype(np.float16), v.astype(np.float16), slots)
                s.append(tokens[hit:])
                prompt, reused = prompt + len(tokens), reused + hit
            last = np.array([t[-1] for t in batch], np.int32)
            for _ in range(args.new_tokens):                      # decode, as a batch
                lens = [len(s) for s in seqs]
                pt = kvarena.PageTable.from_seqs(seqs, [n + 1 for n in lens])
                slots = np.concatenate([s.slots(n) for s, n in zip(seqs, lens)])
                out = None
                for layer in range(L):
                    k, v = kv_of(last, np.array(lens), layer, H, D)
                    w.store_kv(layer, k, v, slots)
                    q = np.repeat(k, 2, axis=1)                   # 2 query heads per KV head
                    out = w.decode(layer, q, pt)
                last = (np.abs(out).sum(axis=(1, 2)) * 1e4).astype(np.int32) % 32000
                for s, t in zip(seqs, last):
                    s.append([t])
                decoded += len(seqs)
            for s in seqs:
                s.close()
        results.put((index, len(stream), prompt, reused, decoded, bad,
                     time.monotonic() - start))


def start_agent(path, blocks):
    """A kvarena-agent of our own in a temporary directory; wait until it serves."""
    sock = os.path.join(tempfile.mkdtemp(prefix="kva-engine-"), "agent.sock")
    cmd = [path, "--socket", sock, "--blocks", str(blocks), "--block-tokens", "16",
           "--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--dtype", "f16",
           "--log-level", "warn"]
    agent = subprocess.Popen(cmd)
    for _ in range(500):
        try:
            kvarena.observe(sock).close()
            return agent, sock
        except kvarena.KvarenaError:
            if agent.poll() is not None:
                sys.exit(f"engine: {path} exited with status {agent.returncode}")
            time.sleep(0.01)
    sys.exit("engine: the agent did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--agent", help="start this kvarena-agent binary in a temporary dir")
    where.add_argument("--socket", help="or use the agent listening on this socket")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--requests", type=int, default=40, help="per process")
    ap.add_argument("--batch", type=int, default=4, help="requests decoded together")
    ap.add_argument("--prompts", type=int, default=6, help="distinct system prompts")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="of a system prompt")
    ap.add_argument("--new-tokens", type=int, default=8, help="generated per request")
    args = ap.parse_args()

    agent = None
    if args.agent:
        lib = Path(args.agent).resolve().parent.parent / "libkvarena.so"
        if "KVARENA_LIB" not in os.environ and lib.exists():
            os.environ["KVARENA_LIB"] = str(lib)  # the library of the same build
        agent, socket = start_agent(args.agent, blocks=4096)
    else:
        socket = args.socket
    try:
        ctx = mp.get_context("spawn")  # each engine attaches on its own, after the start
        results = ctx.Queue()
        procs = [ctx.Process(target=engine, args=(i, socket, args, results))
                 for i in range(args.processes)]
        for p in procs:
            p.start()
        rows = sorted(results.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
        with kvarena.observe(socket) as o:
            ps, check = o.prefix_stats(), o.check()
        g = o.info.geometry
        print(f"{args.processes} engine processes x {args.requests} requests, {args.prompts} "
              f"system prompts of {args.prompt_tokens} tokens; arena of {o.info.blocks} blocks "
              f"x {g.block_tokens} tokens x {g.layers} layers ({g.dtype.label})")
        print(f"{'process':<10}{'requests':>9}{'prompt tok':>12}{'reused tok':>12}{'reuse':>8}"
              f"{'decoded':>9}{'bad':>5}{'seconds':>9}")
        for i, n, prompt, reused, decoded, bad, secs in rows:
            print(f"engine-{i:<3}{n:>9}{prompt:>12}{reused:>12}{reused / prompt:>8.1%}"
                  f"{decoded:>9}{bad:>5}{secs:>9.2f}")
        tot = [sum(r[k] for r in rows) for k in range(1, 6)]
        print(f"{'total':<10}{tot[0]:>9}{tot[1]:>12}{tot[2]:>12}{tot[2] / tot[1]:>8.1%}"
              f"{tot[3]:>9}{tot[4]:>5}")
        print(f"prefix index: {ps.hits} full blocks matched, {ps.misses} computed (hit ratio "
              f"{ps.hit_ratio:.2f}), {ps.published} published, {ps.duplicates} duplicates, "
              f"{ps.evictions} evicted; arena check {'ok' if check.ok else check.first_problem}")
        return 0 if check.ok and tot[4] == 0 and all(p.exitcode == 0 for p in procs) else 1
    finally:
        if agent:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
            shutil.rmtree(os.path.dirname(socket), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
