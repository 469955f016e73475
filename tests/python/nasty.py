# SPDX-License-Identifier: MIT
"""Bad arguments to every call of the binding, each with the exception it
must raise. test_args.py runs them in a process of their own (a crash there
is a failed test, not a dead test run): ``python3 nasty.py SOCKET``.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any, Callable

import numpy as np

import kvarena
from kvarena import InvalidArgument as Inval
from kvarena import PageTable

Case = tuple[str, Callable[[], Any], type]


def cases(w: kvarena.Worker) -> list[Case]:
    g = w.info.geometry
    bb = w.info.block_bytes
    nb = w.blocks
    [blk] = w.alloc(1)
    s = w.open_seq(model="nasty")
    s.reserve(40)
    ok_q = np.zeros((1, 4, g.head_dim), np.float32)
    ok_pt = PageTable([0, 1], [blk], [1], g.block_tokens)
    kv = np.zeros((2, g.kv_heads, g.head_dim), np.float32)
    slots = np.array([blk * g.block_tokens, blk * g.block_tokens + 1], np.int64)
    big = 1 << 70
    out: list[Case] = [
        # alloc / free / share: types, ranges, sizes
        ("alloc float", lambda: w.alloc(1.5), TypeError),
        ("alloc str", lambda: w.alloc("3"), TypeError),
        ("alloc bool", lambda: w.alloc(True), TypeError),
        ("alloc None", lambda: w.alloc(None), TypeError),
        ("alloc -1", lambda: w.alloc(-1), Inval),
        ("alloc 2^32", lambda: w.alloc(1 << 32), Inval),
        ("alloc huge", lambda: w.alloc(big), Inval),
        ("alloc > blocks", lambda: w.alloc(nb + 1), kvarena.NoSpace),
        ("free -1", lambda: w.free([-1]), Inval),
        ("free id = blocks", lambda: w.free([nb]), Inval),
        ("free 2^40", lambda: w.free([1 << 40]), Inval),
        ("free 2^70", lambda: w.free([big]), Inval),
        ("free -2^70", lambda: w.free([-big]), Inval),
        ("free float", lambda: w.free([1.0]), TypeError),
        ("free str", lambda: w.free("ab"), TypeError),
        ("free bytes", lambda: w.free(b"\x01"), TypeError),
        ("free None", lambda: w.free(None), TypeError),
        ("free object", lambda: w.free(object()), TypeError),
        ("free bools", lambda: w.free([True]), TypeError),
        ("free 2-D", lambda: w.free(np.array([[1]])), Inval),
        ("free float array", lambda: w.free(np.array([1.0])), TypeError),
        ("free uint64 max", lambda: w.free(np.array([2**64 - 1], np.uint64)), Inval),
        ("free int8 -1", lambda: w.free(np.array([-1], np.int8)), Inval),
        ("free not held", lambda: w.free([nb - 1]), kvarena.NotPermitted),
        ("share -1", lambda: w.share([-1]), Inval),
        ("share id = blocks", lambda: w.share(np.array([nb])), Inval),
        ("share str", lambda: w.share(["x"]), TypeError),
        ("set_cache -1", lambda: w.set_cache(-1), Inval),
        # block bytes and views
        ("block_kv -1", lambda: w.block_kv(-1, 0), Inval),
        ("block_kv id = blocks", lambda: w.block_kv(nb, 0), Inval),
        ("block_kv 2^64", lambda: w.block_kv(1 << 64, 0), Inval),
        ("block_kv layer", lambda: w.block_kv(0, g.layers), Inval),
        ("block_kv layer -1", lambda: w.block_kv(0, -1), Inval),
        ("block_kv float", lambda: w.block_kv(0.0, 0), TypeError),
        ("kv_cache layer", lambda: w.kv_cache(g.layers), Inval),
        ("block_scales not int8", lambda: w.block_scales(0, 0), Inval),
        ("block_kv_ptr layer", lambda: w.block_kv_ptr(0, 99), Inval),
        ("block_read offset", lambda: w.block_read(0, bb + 1), Inval),
        ("block_read n", lambda: w.block_read(0, 0, bb + 1), Inval),
        ("block_read n past end", lambda: w.block_read(0, bb - 1, 2), Inval),
        ("block_read -n", lambda: w.block_read(0, 0, -1), Inval),
        ("block_read id", lambda: w.block_read(nb), Inval),
        ("block_write too long", lambda: w.block_write(0, 0, bytes(bb + 1)), Inval),
        ("block_write past end", lambda: w.block_write(0, bb - 1, b"ab"), Inval),
        ("block_write object", lambda: w.block_write(0, 0, object()), TypeError),
        ("block_write str", lambda: w.block_write(0, 0, "text"), TypeError),
        ("block_write non-contiguous",
         lambda: w.block_write(0, 0, np.zeros((4, 4), np.uint8)[:, ::2]), Inval),
        ("block_read_into read-only", lambda: w.block_read_into(0, b"1234"), Inval),
        ("block_read_into too long", lambda: w.block_read_into(0, bytearray(bb + 1)), Inval),
        ("map 0 cells", lambda: w.map(0), Inval),
        ("seq_stats slot", lambda: w.seq_stats(99), Inval),
        # sequences
        ("open_seq kind", lambda: w.open_seq("bogus"), Inval),
        ("open_seq kind 7", lambda: w.open_seq(7), Inval),
        ("open_seq kind float", lambda: w.open_seq(1.0), TypeError),
        ("open_seq model NUL", lambda: w.open_seq(model="a\0b"), Inval),
        ("open_seq model int", lambda: w.open_seq(model=5), TypeError),
        ("open_seq tenant -1", lambda: w.open_seq(tenant=-1), Inval),
        ("open_seq tenant 2^32", lambda: w.open_seq(tenant=1 << 32), Inval),
        ("open_seq run_id 2^64", lambda: w.open_seq(run_id=1 << 64), Inval),
        ("open_seq reserve -1", lambda: w.open_seq(reserve_tokens=-1), Inval),
        ("open_seq reserve too much", lambda: w.open_seq(reserve_tokens=1 << 62),
         (kvarena.NoSpace, kvarena.TooLarge)),
        ("match token 2^31", lambda: s.match([1 << 31]), Inval),
        ("match token -2^31-1", lambda: s.match([-(1 << 31) - 1]), Inval),
        ("match str", lambda: s.match(["a"]), TypeError),
        ("match floats", lambda: s.match(np.array([1.5])), TypeError),
        ("match int64 out of range", lambda: s.match(np.array([1 << 40])), Inval),
        ("match 2-D", lambda: s.match(np.zeros((2, 2), np.int32)), Inval),
        ("match not empty", lambda: (s.append([1]), s.match([1, 2]))[1], kvarena.Busy),
        ("reserve -1", lambda: s.reserve(-1), Inval),
        ("reserve 2^64", lambda: s.reserve(1 << 64), Inval),
        ("reserve SIZE_MAX", lambda: s.reserve((1 << 64) - 1), (kvarena.NoSpace, kvarena.TooLarge)),
        ("reserve 2^63", lambda: s.reserve(1 << 63), (kvarena.NoSpace, kvarena.TooLarge)),
        ("append token 2^31", lambda: s.append([1 << 31]), Inval),
        ("append None", lambda: s.append(None), TypeError),
        ("slots past reserved", lambda: s.slots(0, 10_000), Inval),
        ("slots -1", lambda: s.slots(-1), Inval),
        ("fetch without tiers", lambda: s.fetch_start(), (kvarena.NoData, kvarena.Busy)),
        ("fetch_cancel idle", lambda: s.fetch_cancel(), Inval),
        ("max_tokens", lambda: w.open_seq(max_tokens=10).reserve(11), kvarena.TooLarge),
        ("Seq()", lambda: kvarena.Seq(), TypeError),
        ("prefix_hash parent -1", lambda: kvarena.prefix_hash(-1, 0, [1]), Inval),
        ("prefix_hash parent 2^128", lambda: kvarena.prefix_hash(1 << 128, 0, [1]), Inval),
        ("prefix_keys block_tokens 0", lambda: kvarena.prefix_keys([1], 0), Inval),
        # page tables
        ("pt indptr short", lambda: PageTable([0], [0], [1], 16), Inval),
        ("pt indptr[0]", lambda: PageTable([1, 1], [0], [1], 16), Inval),
        ("pt indptr decreasing", lambda: PageTable([0, 2, 1], [0, 1], [1, 1], 16), Inval),
        ("pt indptr past indices", lambda: PageTable([0, 5], [0], [1], 16), Inval),
        ("pt indptr huge", lambda: PageTable([0, 1 << 31], [0], [1], 16), Inval),
        ("pt last 0 with pages", lambda: PageTable([0, 1], [0], [0], 16), Inval),
        ("pt last > page", lambda: PageTable([0, 1], [0], [17], 16), Inval),
        ("pt last without pages", lambda: PageTable([0, 0], [], [3], 16), Inval),
        ("pt negative index", lambda: PageTable([0, 1], [-1], [1], 16), Inval),
        ("pt page_size 0", lambda: PageTable([0, 1], [0], [1], 0), Inval),
        ("pt floats", lambda: PageTable([0.0, 1.0], [0], [1], 16), TypeError),
        ("bt row too short", lambda: PageTable.from_block_table(np.zeros((2, 1), np.int32),
                                                                [16, 17], 16), Inval),
        ("bt lens mismatch", lambda: PageTable.from_block_table(np.zeros((2, 4), np.int32),
                                                                [1], 16), Inval),
        ("bt 1-D", lambda: PageTable.from_block_table(np.zeros(4, np.int32), [1], 16), Inval),
        ("bt negative len", lambda: PageTable.from_block_table(np.zeros((1, 4), np.int32),
                                                               [-1], 16), Inval),
        ("bt floats", lambda: PageTable.from_block_table(np.zeros((1, 4)), [1], 16), TypeError),
        ("bt id 2^31", lambda: PageTable.from_block_table(np.full((1, 1), 1 << 31, np.int64),
                                                          [1], 16), Inval),
        # decode
        ("decode q list", lambda: w.decode(0, [[0.0]], ok_pt), TypeError),
        ("decode q float64", lambda: w.decode(0, ok_q.astype(np.float64), ok_pt), TypeError),
        ("decode q uint16 unnamed", lambda: w.decode(0, ok_q.view(np.uint16)[:, :, ::2].copy(),
                                                      ok_pt), TypeError),
        ("decode q 2-D", lambda: w.decode(0, ok_q[0], ok_pt), Inval),
        ("decode q non-contiguous",
         lambda: w.decode(0, np.zeros((1, 4, 2 * g.head_dim), np.float32)[:, :, ::2], ok_pt),
         Inval),
        ("decode head_dim", lambda: w.decode(0, np.zeros((1, 4, 8), np.float32), ok_pt), Inval),
        ("decode heads not multiple", lambda: w.decode(0, np.zeros((1, 3, g.head_dim),
                                                                   np.float32), ok_pt), Inval),
        ("decode group > 64", lambda: w.decode(0, np.zeros((1, 65 * g.kv_heads, g.head_dim),
                                                           np.float32), ok_pt), Inval),
        ("decode batch", lambda: w.decode(0, np.zeros((2, 4, g.head_dim), np.float32), ok_pt),
         Inval),
        ("decode page id past cache", lambda: w.decode(0, ok_q, PageTable([0, 1], [nb], [1],
                                                                          g.block_tokens)), Inval),
        ("decode page size", lambda: w.decode(0, ok_q, PageTable([0, 1], [0], [1], 8)), Inval),
        ("decode table type", lambda: w.decode(0, ok_q, ([0, 1], [0], [1])), TypeError),
        ("decode sm_scale nan", lambda: w.decode(0, ok_q, ok_pt, sm_scale=float("nan")), Inval),
        ("decode sm_scale 0", lambda: w.decode(0, ok_q, ok_pt, sm_scale=0), Inval),
        ("decode sm_scale str", lambda: w.decode(0, ok_q, ok_pt, sm_scale="x"), TypeError),
        ("decode threads", lambda: w.decode(0, ok_q, ok_pt, threads=1000), Inval),
        ("decode isa", lambda: w.decode(0, ok_q, ok_pt, isa="sse9"), Inval),
        ("decode pf_step", lambda: w.decode(0, ok_q, ok_pt, pf_step=49), Inval),
        ("decode pf_step < 0", lambda: w.decode(0, ok_q, ok_pt, pf_step=-1), Inval),
        ("decode out shape", lambda: w.decode(0, ok_q, ok_pt, out=np.zeros(3, np.float32)),
         Inval),
        ("decode out read-only",
         lambda: w.decode(0, ok_q, ok_pt, out=np.broadcast_to(np.float32(0), ok_q.shape)),
         Inval),
        ("decode fp8 scales on f16", lambda: w.decode(0, ok_q, ok_pt, k_scale=1.0, v_scale=1.0),
         Inval),
        ("decode layer", lambda: w.decode(g.layers, ok_q, ok_pt), Inval),
        ("decode dtype int8 q", lambda: w.decode(0, ok_q, ok_pt, dtype="int8"), Inval),
        # store
        ("store k shape", lambda: w.store_kv(0, kv[:, :1], kv[:, :1], slots), Inval),
        ("store v shape", lambda: w.store_kv(0, kv, kv[:1], slots), Inval),
        ("store float64", lambda: w.store_kv(0, kv.astype(np.float64), kv.astype(np.float64),
                                             slots), TypeError),
        ("store mixed", lambda: w.store_kv(0, kv, kv.astype(np.float16), slots), TypeError),
        ("store non-contiguous", lambda: w.store_kv(0, kv[::-1], kv, slots), Inval),
        ("store slots short", lambda: w.store_kv(0, kv, kv, slots[:1]), Inval),
        ("store slots float", lambda: w.store_kv(0, kv, kv, slots.astype(np.float64)),
         TypeError),
        ("store slots strs", lambda: w.store_kv(0, kv, kv, ["a", "b"]), TypeError),
        ("store slots ragged", lambda: w.store_kv(0, kv, kv, [[0], [1, 2]]), TypeError),
        ("store slot past end", lambda: w.store_kv(0, kv, kv, np.array([0, nb * g.block_tokens],
                                                                        np.int64)), Inval),
        ("store slot uint64 max", lambda: w.store_kv(0, kv, kv, np.array([0, 2**64 - 1],
                                                                          np.uint64)), Inval),
        ("store bf16 unnamed", lambda: w.store_kv(0, kv.view(np.uint16)[:, :, ::2].copy(),
                                                  kv.view(np.uint16)[:, :, ::2].copy(), slots),
         TypeError),
        # descriptors of numpy caches
        ("desc 3-D", lambda: kvarena.KVDesc.from_arrays(np.zeros((2, 2, 2), np.float32),
                                                        np.zeros((2, 2, 2), np.float32)), Inval),
        ("desc layout", lambda: kvarena.KVDesc.from_arrays(np.zeros((1, 1, 1, 1), np.float32),
                                                           np.zeros((1, 1, 1, 1), np.float32),
                                                           layout="XYZ"), Inval),
        ("desc mismatch", lambda: kvarena.KVDesc.from_arrays(np.zeros((1, 1, 1, 2), np.float32),
                                                             np.zeros((1, 1, 1, 1), np.float32)),
         Inval),
        ("desc uint16 unnamed", lambda: kvarena.KVDesc.from_arrays(
            np.zeros((1, 1, 1, 1), np.uint16), np.zeros((1, 1, 1, 1), np.uint16)), TypeError),
        ("desc head_dim strided", lambda: kvarena.KVDesc.from_arrays(
            np.zeros((1, 1, 1, 4), np.float32)[..., ::2], np.zeros((1, 1, 1, 4),
                                                                    np.float32)[..., ::2]), Inval),
        ("desc negative strides", lambda: kvarena.KVDesc.from_arrays(
            np.zeros((2, 1, 1, 1), np.float32)[::-1], np.zeros((2, 1, 1, 1), np.float32)[::-1]),
         Inval),
        ("desc int8 without scales", lambda: kvarena.KVDesc.from_arrays(
            np.zeros((1, 1, 1, 1), np.int8), np.zeros((1, 1, 1, 1), np.int8), dtype="int8"),
         Inval),
        ("desc empty", lambda: kvarena.KVDesc.from_arrays(np.zeros((0, 1, 1, 1), np.float32),
                                                          np.zeros((0, 1, 1, 1), np.float32)),
         Inval),
        ("store read-only cache", lambda: kvarena.store_kv(
            kvarena.KVDesc.from_arrays(*[np.broadcast_to(np.float32(0), (1, 2, 2, 64))] * 2),
            np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32),
            np.array([0], np.int64)), Inval),
        ("store desc type", lambda: kvarena.store_kv("desc", kv, kv, slots), TypeError),
        # misc
        ("Worker()", lambda: kvarena.Worker(), TypeError),
        ("dtype parse", lambda: kvarena.DType.of("f64"), ValueError),
        ("bf16 of float", lambda: kvarena.bf16_to_float32(np.zeros(2)), TypeError),
        ("observe empty", lambda: kvarena.observe(""), Inval),
    ]
    return out


def main(socket: str) -> int:
    failed = 0
    with kvarena.attach(socket, "nasty") as w:
        todo = cases(w)
        for name, call, want in todo:
            try:
                call()
            except want:
                continue
            except BaseException as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}: raised {type(e).__name__}: {e}, wanted {want}")
                traceback.print_exc(limit=3)
                continue
            failed += 1
            print(f"FAIL {name}: raised nothing, wanted {want}")
        assert w.check().ok
    print(f"{len(todo) - failed} of {len(todo)} cases raised what they should")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
