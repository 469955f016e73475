# SPDX-License-Identifier: MIT
"""store_kv and decode against a numpy reference of attention
(softmax(q.k^T * scale).v per query head, GQA), over FlashInfer's CSR page
table and vLLM's padded block table, on the arena's blocks (every dtype,
both layouts) and on caches in numpy arrays (NHD, HND)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import kvarena
from kvarena import PageTable

RNG = np.random.default_rng(1234)


def reference(kc: np.ndarray, vc: np.ndarray, q: np.ndarray, pt: PageTable,
              sm_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Attention in float64 over an HND cache ``[pages, kv_heads, P, D]`` (float)."""
    batch, heads, dim = q.shape
    kv_heads = kc.shape[1]
    group = heads // kv_heads
    out = np.zeros((batch, heads, dim))
    lse = np.full((batch, heads), -np.inf)
    for b, n in enumerate(pt.seq_lens):
        pages = pt.indices[pt.indptr[b]:pt.indptr[b + 1]]
        if n == 0:
            continue
        K = kc[pages].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, dim)[:, :n]
        V = vc[pages].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, dim)[:, :n]
        for h in range(heads):
            s = sm_scale * (K[h // group] @ q[b, h].astype(np.float64))
            m = s.max()
            p = np.exp(s - m)
            lse[b, h] = m + math.log(p.sum())
            out[b, h] = (p / p.sum()) @ V[h // group]
    return out, lse


def dequantized(w: kvarena.Worker, layer: int, k_scale=None, v_scale=None):
    """The arena's layer as float64 HND caches, read back through the views."""
    kc, vc = w.kv_cache(layer)
    d = w.dtype
    if d == kvarena.DType.BF16:
        return kvarena.bf16_to_float32(kc), kvarena.bf16_to_float32(vc)
    if d == kvarena.DType.FP8_E4M3:
        ks = np.asarray(k_scale, np.float64).reshape(-1, 1, 1) if np.ndim(k_scale) else k_scale
        vs = np.asarray(v_scale, np.float64).reshape(-1, 1, 1) if np.ndim(v_scale) else v_scale
        return (kvarena.fp8_e4m3_to_float32(kc) * ks, kvarena.fp8_e4m3_to_float32(vc) * vs)
    if d == kvarena.DType.INT8:
        ks, vs = w.scale_cache(layer)
        return kc * ks[..., None].astype(np.float64), vc * vs[..., None].astype(np.float64)
    return kc, vc


def fill_seqs(w: kvarena.Worker, lens: list[int], layer: int, **scales):
    """Sequences of the given lengths, their K/V stored (random, f32 in)."""
    g = w.info.geometry
    seqs, ks, vs = [], [], []
    for i, n in enumerate(lens):
        s = w.open_seq(model=f"kernels-{i}-{RNG.integers(1 << 30)}")
        s.reserve(n + 1)
        k = RNG.standard_normal((n, g.kv_heads, g.head_dim)).astype(np.float32)
        v = RNG.standard_normal((n, g.kv_heads, g.head_dim)).astype(np.float32)
        w.store_kv(layer, k, v, s.slots(0, n), **scales)
        s.append(RNG.integers(0, 50000, n))
        seqs.append(s)
        ks.append(k)
        vs.append(v)
    return seqs, ks, vs


def check(out, lse, ref_out, ref_lse, tol):
    assert out.shape == ref_out.shape
    err = np.abs(out.astype(np.float64) - ref_out).max() / max(1.0, np.abs(ref_out).max())
    assert err < tol, f"max relative error {err}"
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


LENS = [1, 15, 16, 17, 40, 0, 100]


@pytest.mark.parametrize("dtype,tol", [("f32", 2e-5), ("f16", 2e-3), ("bf16", 2e-3),
                                       ("fp8_e4m3", 2e-3), ("int8", 2e-3)])
@pytest.mark.parametrize("layout", ["block-major", "layer-major"])
def test_store_and_decode_against_reference(make_agent, dtype, tol, layout):
    a = make_agent("--blocks", "128", "--dtype", dtype, "--layout", layout, "--kv-heads", "2",
                   "--head-dim", "64", "--layers", "3", "--block-tokens", "16")
    with kvarena.attach(a.socket) as w:
        g = w.info.geometry
        assert g.dtype.label == dtype
        scales = {}
        if dtype == "fp8_e4m3":
            scales = dict(k_scale=np.array([0.05, 0.02], np.float32),
                          v_scale=np.array([0.03, 0.04], np.float32))
        layer = 1
        seqs, ks, vs = fill_seqs(w, LENS, layer, **scales)
        pt = PageTable.from_seqs(seqs)
        assert list(pt.seq_lens) == LENS
        q = RNG.standard_normal((len(LENS), 8, g.head_dim)).astype(np.float32)  # group of 4
        out, lse = w.decode(layer, q, pt, return_lse=True, **scales)
        assert out.dtype == np.float32 and lse.shape == (len(LENS), 8)
        kc, vc = dequantized(w, layer, **scales)
        if dtype == "int8":  # one block's scales are the layer's, for that block
            b = int(pt.indices[0])
            k_s, v_s = w.block_scales(b, layer)
            assert k_s.shape == (g.kv_heads, g.block_tokens) and k_s.dtype == np.float32
            assert np.array_equal(k_s, w.scale_cache(layer)[0][b]) and k_s[0, 0] > 0
        scale = 1 / math.sqrt(g.head_dim)
        ref_out, ref_lse = reference(kc, vc, q, pt, scale)
        check(out, lse, ref_out, ref_lse, tol)
        # an empty sequence: lse -inf, output 0
        assert np.all(lse[LENS.index(0)] == -np.inf) and np.all(out[LENS.index(0)] == 0)
        # against the K/V that went in (quantization error only)
        if dtype == "f32":
            raw_k = np.concatenate([k.transpose(1, 0, 2) for k in ks[:1]], axis=1)
            assert np.array_equal(kc[pt.indices[0], :, :1], raw_k)
        # vLLM's padded block table gives the same page table and result
        tables = [s.block_table()[0] for s in seqs]
        width = max(len(t) for t in tables) + 2
        bt = np.full((len(seqs), width), -7, np.int32)  # padding is never read
        for i, t in enumerate(tables):
            bt[i, :len(t)] = t
        pt2 = PageTable.from_block_table(bt, np.array(LENS, np.int32), g.block_tokens)
        assert np.array_equal(pt2.indptr, pt.indptr)
        assert np.array_equal(pt2.indices, pt.indices)
        assert np.array_equal(pt2.last_page_len, pt.last_page_len)
        out2 = w.decode(layer, q, pt2, **scales)
        assert np.array_equal(out2, out)
        # other layers untouched
        k0, _ = w.kv_cache(0)
        assert not np.any(k0[pt.indices].view(np.uint8))
        for s in seqs:
            s.close()


def test_decode_options_and_io_dtypes(make_agent):
    a = make_agent("--blocks", "256", "--dtype", "f16", "--head-dim", "128", "--kv-heads", "1",
                   "--layers", "1", "--block-tokens", "32")
    with kvarena.attach(a.socket) as w:
        lens = [700, 33, 1300]
        seqs, _, _ = fill_seqs(w, lens, 0)
        pt = PageTable.from_seqs(seqs)
        q = RNG.standard_normal((3, 8, 128)).astype(np.float32)  # MQA-like, group 8
        kc, vc = dequantized(w, 0)
        ref_out, ref_lse = reference(kc, vc, q, pt, 0.1)
        base, lse = w.decode(0, q, pt, sm_scale=0.1, return_lse=True)
        check(base, lse, ref_out, ref_lse, 2e-3)
        # results do not depend on threads; other splits and ISAs agree closely
        for threads in (1, 2, 3):
            assert np.array_equal(w.decode(0, q, pt, sm_scale=0.1, threads=threads), base)
        # the AVX2 path's prefetch step moves no bit (the other paths ignore it)
        for step in (1, 4, 8, 48):
            assert np.array_equal(w.decode(0, q, pt, sm_scale=0.1, pf_step=step), base)
        other = w.decode(0, q, pt, sm_scale=0.1, split_tokens=64, max_splits=4, isa="scalar")
        np.testing.assert_allclose(other, base, rtol=1e-4, atol=1e-5)
        # f16 and bf16 queries and outputs
        q16 = q.astype(np.float16)
        o16 = w.decode(0, q16, pt, sm_scale=0.1)
        assert o16.dtype == np.float16
        check(o16, ref_lse, *reference(kc, vc, q16.astype(np.float32), pt, 0.1), 3e-3)
        qb = kvarena.float32_to_bf16(q)
        ob = w.decode(0, qb, pt, sm_scale=0.1, dtype="bf16")
        assert ob.dtype == np.uint16
        ref_b, _ = reference(kc, vc, kvarena.bf16_to_float32(qb), pt, 0.1)
        assert np.abs(kvarena.bf16_to_float32(ob) - ref_b).max() < 2e-2
        # into a caller's array
        out = np.empty_like(q)
        assert w.decode(0, q, pt, sm_scale=0.1, out=out) is out
        assert np.array_equal(out, base)
        # an empty batch
        empty = w.decode(0, np.zeros((0, 8, 128), np.float32), PageTable([0], [], [], 32))
        assert empty.shape == (0, 8, 128)


def test_store_bf16_and_f16_inputs(make_agent):
    a = make_agent("--blocks", "32", "--dtype", "f32")
    with kvarena.attach(a.socket) as w:
        g = w.info.geometry
        [b] = w.alloc(1)
        x = RNG.standard_normal((3, g.kv_heads, g.head_dim)).astype(np.float32)
        slots = np.array([b * 16 + 0, -1, b * 16 + 5], np.int64)  # -1: skipped
        w.store_kv(0, kvarena.float32_to_bf16(x), kvarena.float32_to_bf16(-x), slots,
                   dtype="bf16")
        k, v = w.block_kv(b, 0)
        bf = kvarena.bf16_to_float32(kvarena.float32_to_bf16(x))
        assert np.array_equal(k[:, 0], bf[0]) and np.array_equal(v[:, 5], -bf[2])
        assert not np.any(k[:, 1])  # the skipped token
        w.store_kv(1, x.astype(np.float16), x.astype(np.float16), slots)
        k1, _ = w.block_kv(b, 1)
        assert np.array_equal(k1[:, 5], x[2].astype(np.float16).astype(np.float32))
        # all or nothing: one bad slot writes nothing
        before = w.block_read(b)
        with pytest.raises(kvarena.InvalidArgument) as e:
            w.store_kv(0, x, x, np.array([b * 16 + 2, 10**9, b * 16 + 3], np.int64))
        assert "past the last page" in str(e.value)
        assert w.block_read(b) == before
        w.free([b])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_numpy_caches(layout):
    pages, P, H, D = 12, 8, 2, 32
    shape = (pages, P, H, D) if layout == "NHD" else (pages, H, P, D)
    kc = np.zeros(shape, np.float32)
    vc = np.zeros(shape, np.float32)
    desc = kvarena.KVDesc.from_arrays(kc, vc, layout=layout)
    assert desc.num_pages == pages and desc.page_size == P and desc.num_kv_heads == H
    n = 30
    k = RNG.standard_normal((n, H, D)).astype(np.float32)
    v = RNG.standard_normal((n, H, D)).astype(np.float32)
    order = RNG.permutation(pages)[:4]  # scattered pages
    slots = (order[np.arange(n) // P] * P + np.arange(n) % P).astype(np.int64)
    kvarena.store_kv(desc, k, v, slots)
    hnd_k = kc if layout == "HND" else kc.transpose(0, 2, 1, 3)
    hnd_v = vc if layout == "HND" else vc.transpose(0, 2, 1, 3)
    assert np.array_equal(hnd_k[order[0], :, 3], k[3])
    pt = PageTable([0, 4], order, [n - 3 * P], P)
    q = RNG.standard_normal((1, 4, D)).astype(np.float32)
    out, lse = kvarena.decode(desc, q, pt, return_lse=True)
    check(out, lse, *reference(hnd_k, hnd_v, q, pt, 1 / math.sqrt(D)), 2e-5)


def test_numpy_int8_and_fp8_caches():
    pages, P, H, D = 4, 4, 1, 16
    kc = np.zeros((pages, P, H, D), np.int8)
    vc = np.zeros_like(kc)
    ks = np.zeros((pages, P, H), np.float32)
    vs = np.zeros_like(ks)
    desc = kvarena.KVDesc.from_arrays(kc, vc, dtype="int8", k_scale_cache=ks, v_scale_cache=vs)
    x = RNG.standard_normal((P, H, D)).astype(np.float32)
    kvarena.store_kv(desc, x, x, np.arange(P, dtype=np.int64))
    back = kc[0].astype(np.float32) * ks[0][..., None]
    assert np.abs(back - x).max() <= np.abs(x).max() / 127 + 1e-6
    fc = np.zeros((pages, P, H, D), np.uint8)
    fdesc = kvarena.KVDesc.from_arrays(fc, fc.copy(), dtype="fp8_e4m3")
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.store_kv(fdesc, x, x, np.arange(P, dtype=np.int64))  # no scales
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.store_kv(fdesc, x, x, np.arange(P, dtype=np.int64), k_scale=-1.0, v_scale=1.0)
    kvarena.store_kv(fdesc, x, x, np.arange(P, dtype=np.int64), k_scale=0.01, v_scale=0.01)
    back = kvarena.fp8_e4m3_to_float32(fc[0]) * 0.01
    assert np.abs(back - x).max() < 0.07 * np.abs(x).max()


def test_dtype_conversions():
    x = np.array([0.0, 1.0, -2.5, 3.14159, 1e-40, np.inf, np.nan], np.float32)
    b = kvarena.float32_to_bf16(x)
    assert b.dtype == np.uint16 and b[1] == 0x3F80
    back = kvarena.bf16_to_float32(b)
    assert back[2] == -2.5 and np.isnan(back[-1]) and np.isinf(back[-2])
    assert abs(back[3] - 3.14159) < 0.01
    f = kvarena.fp8_e4m3_to_float32(np.arange(256, dtype=np.uint8))
    assert f[0x38] == 1.0 and f[0x7E] == 448.0 and np.isnan(f[0x7F]) and f[0x01] == 2.0 ** -9
    assert kvarena.DType.of("bfloat16") is kvarena.DType.BF16
    assert kvarena.DType.of(np.float16) is kvarena.DType.F16
    assert kvarena.DType.FP8_E4M3.numpy == np.uint8 and kvarena.DType.INT8.itemsize == 1


def test_decode_tile_names_a_tile_and_refuses_bad_arguments():
    best = kvarena.isa_best()
    assert kvarena.decode_tile(12, 8, "scalar") == "scalar"
    assert kvarena.decode_tile(12, 8) == "scalar"
    assert kvarena.decode_tile(128, 8, "avx2" if best != "scalar" else "scalar") in ("avx2", "scalar")
    if best == "avx512":
        assert kvarena.decode_tile(128, 16, "avx512") == "avx512"
        assert kvarena.decode_tile(128, 8, "avx512") in ("avx512", "avx2")
        assert kvarena.decode_tile(128, 8) == kvarena.decode_tile(128, 8, "avx512")
        with pytest.raises(kvarena.InvalidArgument, match="multiple of 16"):
            kvarena.decode_tile(40, 8, "avx512")
    for bad in ((0, 8), (1025, 8), (128, 0), (128, 65)):
        with pytest.raises(kvarena.InvalidArgument):
            kvarena.decode_tile(*bad)
    with pytest.raises(kvarena.InvalidArgument):
        kvarena.decode_tile(128, 8, "sse")
