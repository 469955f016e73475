# SPDX-License-Identifier: MIT
"""Paged decode attention and KV store over numpy arrays.

The kernels are libkvarena's CPU kernels (``kvarena_kernels.h``): portable
C, AVX2 and AVX-512, threaded by the library's own pool, with the GIL
released while they run. They read and write the arena's blocks in place
(:meth:`kvarena.Worker.kv_desc`) or any paged cache in numpy arrays
(:meth:`KVDesc.from_arrays`, FlashInfer's NHD or HND shapes).

Page tables are FlashInfer's CSR form (:class:`PageTable`: ``indptr``,
``indices``, ``last_page_len``, int32), or built from vLLM's padded block
table (:meth:`PageTable.from_block_table`).

Everything the C functions would read is checked here first (shapes,
dtypes, contiguity, lengths of the page table's arrays), so that no
argument can make them read or write outside a buffer; what only the values
can say (a page id past the cache, a slot past the last page) the library
checks, and both are :class:`~kvarena.InvalidArgument` with a sentence.
"""
from __future__ import annotations

import ctypes
import errno
import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _abi as A
from . import _lib
from ._args import I32, as_i32_array, as_int
from .dtypes import DType, DTypeLike
from .errors import InvalidArgument, NotSupported

__all__ = [
    "PageTable",
    "KVDesc",
    "store_kv",
    "decode",
    "kernel_threads",
    "isa_best",
    "decode_tile",
    "ISAS",
]

#: ``enum kva_isa`` by name (``decode(..., isa=...)``)
ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}
MAX_HEAD_DIM = 1024
MAX_GROUP = 64

_IO_DTYPES = {DType.F32, DType.F16, DType.BF16}


def _einval(msg: str) -> InvalidArgument:
    return InvalidArgument(22, msg)


def _io_dtype(name: str, arr: np.ndarray, dtype: Optional[DTypeLike]) -> DType:
    """The kvarena dtype of a q / k / v input: float32, float16, or uint16
    holding bf16 bits when ``dtype="bf16"`` says so."""
    if dtype is not None:
        d = DType.of(dtype)
        if d not in _IO_DTYPES:
            raise _einval(f"{name}: inputs and outputs are f32, f16 or bf16, not {d.label}")
        if arr.dtype != d.numpy:
            raise TypeError(f"{name} is {arr.dtype}; {d.label} data must be {d.numpy}")
        return d
    if arr.dtype == np.float32:
        return DType.F32
    if arr.dtype == np.float16:
        return DType.F16
    if arr.dtype == np.uint16:
        raise TypeError(f"{name} is uint16: pass dtype=\"bf16\" if it holds bfloat16 bits")
    raise TypeError(f"{name} must be float32 or float16 (or bf16 bits as uint16), "
                    f"not {arr.dtype}")


def _array(name: str, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(x).__name__}")
    return x


def _contiguous(name: str, x: np.ndarray) -> None:
    if not x.flags.c_contiguous:
        raise _einval(f"{name} must be C-contiguous (np.ascontiguousarray)")


# --------------------------------------------------------------- page table


class PageTable:
    """FlashInfer's CSR page table (``struct kva_page_table``): sequence
    ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]`` of ``page_size``
    tokens, the last of which holds ``last_page_len[b]`` tokens (1..page_size;
    0 for a sequence of no page).

    The arrays are int32 and C-contiguous (converted, range-checked, when
    they are not); they are checked for consistency here, and the page ids
    against the cache when a kernel runs.
    """

    __slots__ = ("indptr", "indices", "last_page_len", "page_size")

    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray
    page_size: int

    def __init__(self, indptr: Any, indices: Any, last_page_len: Any, page_size: int) -> None:
        page_size = as_int("page_size", page_size, 1, 65536)
        indptr_a = as_i32_array("indptr", indptr, 0, I32)
        indices_a = as_i32_array("indices", indices, 0, I32)
        last = as_i32_array("last_page_len", last_page_len, 0, page_size)
        batch = last.shape[0]
        if indptr_a.shape[0] != batch + 1:
            raise _einval(f"indptr has {indptr_a.shape[0]} entries; a batch of {batch} "
                          f"(last_page_len) needs {batch + 1}")
        if indptr_a[0] != 0:
            raise _einval("indptr[0] must be 0")
        pages = np.diff(indptr_a.astype(np.int64))
        if (pages < 0).any():
            raise _einval("indptr must not decrease")
        if int(indptr_a[-1]) > indices_a.shape[0]:
            raise _einval(f"indptr[-1] = {int(indptr_a[-1])} but indices has "
                          f"{indices_a.shape[0]} entries")
        if ((pages > 0) & (last == 0)).any() or ((pages == 0) & (last != 0)).any():
            raise _einval("last_page_len must be 1..page_size for a sequence with pages, "
                          "0 for one without")
        # our own read-only copies: what the kernels read is what was checked
        # here, whatever the caller does with its arrays afterwards
        arrs = []
        for arr in (indptr_a, indices_a[: int(indptr_a[-1])], last):
            arr = arr.copy()
            arr.flags.writeable = False
            arrs.append(arr)
        self.indptr, self.indices, self.last_page_len = arrs
        self.page_size = page_size

    @property
    def batch(self) -> int:
        """Number of sequences."""
        return int(self.last_page_len.shape[0])

    @property
    def seq_lens(self) -> np.ndarray:
        """Tokens of each sequence (int64)."""
        pages = np.diff(self.indptr.astype(np.int64))
        return np.where(pages > 0, (pages - 1) * self.page_size + self.last_page_len, 0)

    @classmethod
    def from_block_table(cls, block_table: Any, seq_lens: Any, page_size: int) -> "PageTable":
        """vLLM's padded block table (``[batch, max_blocks]`` page ids, of which
        sequence ``b`` uses ``ceil(seq_lens[b] / page_size)``; the rest is
        padding and never read) to CSR, by ``kva_page_table_from_block_table``."""
        page_size = as_int("page_size", page_size, 1, 65536)
        table = as_i32_array("block_table", block_table, -(1 << 31), I32, ndim=2)
        lens = as_i32_array("seq_lens", seq_lens, 0, I32)
        batch, row = table.shape
        if lens.shape[0] != batch:
            raise _einval(f"seq_lens has {lens.shape[0]} entries for a block table of "
                          f"{batch} rows")
        need = (lens.astype(np.int64) + page_size - 1) // page_size
        if batch and int(need.max()) > row:
            b = int(need.argmax())
            raise _einval(f"sequence {b} of {int(lens[b])} tokens needs {int(need[b])} pages; "
                          f"the block table's rows have {row}")
        total = int(need.sum())
        if total > I32:
            raise _einval("more than 2^31 pages in all")
        indptr = np.zeros(batch + 1, np.int32)
        indices = np.zeros(max(total, 1), np.int32)
        last = np.zeros(max(batch, 1), np.int32)
        ret = _lib.lib().kva_page_table_from_block_table(
            table.ctypes.data, row, lens.ctypes.data, batch, page_size, indptr.ctypes.data,
            indices.ctypes.data, last.ctypes.data)
        _lib.check(ret, "kva_page_table_from_block_table")
        return cls(indptr, indices[:total], last[:batch], page_size)

    @classmethod
    def from_seqs(cls, seqs: Sequence[Any], lengths: Optional[Sequence[int]] = None) -> "PageTable":
        """The page table of kvarena sequences (:class:`kvarena.Seq`): each
        one's blocks, over ``lengths[i]`` tokens (default: its length; more
        is fine up to what it has reserved, e.g. ``len(s) + 1`` for the token
        being decoded)."""
        seqs = list(seqs)
        tables = [s.block_table() for s in seqs]
        if lengths is None:
            lens = [n for _, n in tables]
        else:
            lens = [as_int("lengths", x, 0, I32) for x in lengths]
            if len(lens) != len(tables):
                raise _einval(f"{len(lens)} lengths for {len(tables)} sequences")
        if not seqs:
            return cls(np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), 1)
        page = seqs[0].block_tokens
        parts, indptr, last = [], [0], []
        for (ids, _), n, s in zip(tables, lens, seqs):
            if s.block_tokens != page:
                raise _einval("sequences of arenas with different block sizes")
            pages = -(-n // page)
            if pages > ids.shape[0]:
                raise _einval(f"a sequence of {ids.shape[0]} blocks cannot hold {n} tokens: "
                              "reserve first")
            parts.append(ids[:pages])
            indptr.append(indptr[-1] + pages)
            last.append(n - (pages - 1) * page if pages else 0)
        return cls(np.array(indptr, np.int32), np.concatenate(parts).astype(np.int32),
                   np.array(last, np.int32), page)

    def _c(self) -> A.kva_page_table:
        pt = A.kva_page_table()
        pt.batch = self.batch
        pt.page_size = self.page_size
        i32p = ctypes.POINTER(ctypes.c_int32)
        pt.indptr = ctypes.cast(self.indptr.ctypes.data, i32p)
        pt.indices = ctypes.cast(self.indices.ctypes.data, i32p)
        pt.last_page_len = ctypes.cast(self.last_page_len.ctypes.data, i32p)
        return pt

    def __repr__(self) -> str:
        return (f"PageTable(batch={self.batch}, page_size={self.page_size}, "
                f"pages={int(self.indptr[-1])}, seq_lens={self.seq_lens.tolist()[:8]}"
                f"{'...' if self.batch > 8 else ''})")


# --------------------------------------------------------------- descriptor


class KVDesc:
    """One layer's paged K and V as the kernels address them (``struct
    kva_kv_desc``): base pointers, strides in elements, heads, dtype, scales.

    Made by :meth:`kvarena.Worker.kv_desc` (the arena's blocks: block ids
    are page ids) or :meth:`from_arrays` (a cache in numpy arrays). A KVDesc
    keeps the memory it points to alive; it never points anywhere else.
    """

    __slots__ = ("_c", "_keep", "device", "writable")

    _c: A.kva_kv_desc
    _keep: tuple[Any, ...]
    device: bool  #: pointers are a GPU's: the CPU kernels refuse it
    writable: bool  #: store_kv may write through it

    def __init__(self) -> None:
        raise TypeError("descriptors are made by KVDesc.from_arrays() or Worker.kv_desc()")

    @classmethod
    def _make(cls, c: A.kva_kv_desc, keep: tuple[Any, ...], device: bool = False,
              writable: bool = True) -> "KVDesc":
        # private: the pointers in c must point into what keep holds
        self = object.__new__(cls)
        self._c, self._keep, self.device, self.writable = c, keep, device, writable
        return self

    def __reduce__(self) -> Any:
        raise TypeError("a KVDesc points into this process's memory; it cannot be pickled")

    # read-only views of the C fields
    @property
    def dtype(self) -> DType:
        """The cache's element type."""
        return DType(self._c.dtype)

    @property
    def num_pages(self) -> int:
        """Valid page ids are 0..num_pages-1."""
        return int(self._c.num_pages)

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return int(self._c.page_size)

    @property
    def num_kv_heads(self) -> int:
        """KV heads."""
        return int(self._c.num_kv_heads)

    @property
    def head_dim(self) -> int:
        """Elements per head and token."""
        return int(self._c.head_dim)

    @property
    def strides(self) -> tuple[int, int, int]:
        """(page_stride, token_stride, head_stride), in elements."""
        return (int(self._c.page_stride), int(self._c.token_stride), int(self._c.head_stride))

    @property
    def pointers(self) -> tuple[int, int]:
        """(k, v) base addresses: device pointers for a GPU arena (for your own
        kernels or ``kva_decode_cuda``); host addresses otherwise."""
        return (int(self._c.k or 0), int(self._c.v or 0))

    @classmethod
    def from_arrays(cls, k_cache: np.ndarray, v_cache: np.ndarray, layout: str = "NHD",
                    dtype: Optional[DTypeLike] = None,
                    k_scale_cache: Optional[np.ndarray] = None,
                    v_scale_cache: Optional[np.ndarray] = None) -> "KVDesc":
        """A paged cache in numpy arrays: ``layout="NHD"``: ``[num_pages,
        page_size, num_kv_heads, head_dim]`` (vLLM, FlashInfer's default);
        ``"HND"``: ``[num_pages, num_kv_heads, page_size, head_dim]`` (the
        arena's own order). Any strides whose last dimension is contiguous.

        ``dtype``: float32 / float16 arrays are f32 / f16; name it for
        ``"bf16"`` (uint16 bits), ``"fp8_e4m3"`` (uint8 bits) or ``"int8"``
        (which also needs ``k_scale_cache`` / ``v_scale_cache``: float32 of
        the cache's shape without head_dim). fp8 scales are given at the
        call (:func:`store_kv`, :func:`decode`).
        """
        k = _array("k_cache", k_cache)
        v = _array("v_cache", v_cache)
        if layout not in ("NHD", "HND"):
            raise _einval(f"layout must be \"NHD\" or \"HND\", not {layout!r}")
        if k.ndim != 4:
            raise _einval(f"k_cache must have 4 dimensions, not shape {k.shape}")
        if k.shape != v.shape or k.dtype != v.dtype or k.strides != v.strides:
            raise _einval("k_cache and v_cache must have the same shape, dtype and strides")
        if dtype is None:
            if k.dtype == np.float32:
                d = DType.F32
            elif k.dtype == np.float16:
                d = DType.F16
            else:
                raise TypeError(f"a cache of {k.dtype}: name its dtype (bf16, fp8_e4m3, int8)")
        else:
            d = DType.of(dtype)
            if k.dtype != d.numpy:
                raise TypeError(f"a {d.label} cache is {d.numpy}, not {k.dtype}")
        if layout == "NHD":
            pages, page_size, heads, dim = k.shape
            ps, ts, hs, es = k.strides
        else:
            pages, heads, page_size, dim = k.shape
            ps, hs, ts, es = k.strides
        item = k.itemsize
        if 0 in k.shape:
            raise _einval(f"an empty cache (shape {k.shape})")
        if es != item and dim > 1:
            raise _einval("the head_dim axis must be contiguous")
        if any(s < 0 or s % item for s in (ps, ts, hs)):
            raise _einval("strides must be non-negative multiples of the element size")
        if not (1 <= heads <= 4096 and 1 <= dim <= MAX_HEAD_DIM and 1 <= page_size <= 65536
                and pages <= I32):
            raise _einval(f"cache shape {k.shape} out of the kernels' range (kv heads "
                          f"1..4096, head_dim 1..{MAX_HEAD_DIM}, page_size 1..65536)")
        c = A.kva_kv_desc()
        c.k, c.v = k.ctypes.data, v.ctypes.data
        c.page_stride, c.token_stride, c.head_stride = ps // item, ts // item, hs // item
        c.num_kv_heads, c.head_dim, c.dtype = heads, dim, int(d)
        c.page_size, c.num_pages = page_size, pages
        keep: tuple[Any, ...] = (k, v)
        if d == DType.INT8:
            want = (pages, page_size, heads) if layout == "NHD" else (pages, heads, page_size)
            if k_scale_cache is None or v_scale_cache is None:
                raise _einval("an int8 cache needs k_scale_cache and v_scale_cache")
            ks = _array("k_scale_cache", k_scale_cache)
            vs = _array("v_scale_cache", v_scale_cache)
            for name, s in (("k_scale_cache", ks), ("v_scale_cache", vs)):
                if s.dtype != np.float32 or s.shape != want:
                    raise _einval(f"{name} must be float32 of shape {want}, not {s.dtype} "
                                  f"{s.shape}")
            if ks.strides != vs.strides or any(x < 0 or x % 4 for x in ks.strides):
                raise _einval("k_scale_cache and v_scale_cache must have the same "
                              "non-negative strides")
            if layout == "NHD":
                sps, sts, shs = ks.strides
            else:
                sps, shs, sts = ks.strides
            c.k_scale = ctypes.cast(ks.ctypes.data, ctypes.POINTER(ctypes.c_float))
            c.v_scale = ctypes.cast(vs.ctypes.data, ctypes.POINTER(ctypes.c_float))
            c.scale_page_stride, c.scale_token_stride, c.scale_head_stride = (
                sps // 4, sts // 4, shs // 4)
            keep += (ks, vs)
        elif k_scale_cache is not None or v_scale_cache is not None:
            raise _einval("scale caches are for int8 caches only")
        writable = all(x.flags.writeable for x in keep)
        return cls._make(c, keep, device=False, writable=writable)

    def _with_fp8_scales(self, k_scale: Any, v_scale: Any) -> tuple[A.kva_kv_desc, tuple]:
        """This descriptor with fp8 scales set (a copy, with what it points to)."""
        c = A.kva_kv_desc.from_buffer_copy(self._c)
        if self.dtype != DType.FP8_E4M3:
            if k_scale is not None or v_scale is not None:
                raise _einval(f"k_scale / v_scale are for fp8 caches; this one is "
                              f"{self.dtype.label}")
            return c, ()
        if k_scale is None or v_scale is None:
            raise _einval("an fp8 cache needs k_scale and v_scale (a float, or float32 "
                          "[num_kv_heads])")
        arrs = []
        per_tensor = None
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if isinstance(s, (int, float, np.floating, np.integer)) and not isinstance(s, bool):
                a = np.array([float(s)], np.float32)
                pt = True
            else:
                a = _array(name, s)
                if a.dtype != np.float32 or a.shape != (self.num_kv_heads,):
                    raise _einval(f"{name} must be a float or float32 of shape "
                                  f"({self.num_kv_heads},), not {a.dtype} {a.shape}")
                a = np.ascontiguousarray(a)
                pt = False
            if per_tensor is not None and pt != per_tensor:
                raise _einval("k_scale and v_scale must both be floats or both arrays")
            per_tensor = pt
            arrs.append(a)
        c.k_scale = ctypes.cast(arrs[0].ctypes.data, ctypes.POINTER(ctypes.c_float))
        c.v_scale = ctypes.cast(arrs[1].ctypes.data, ctypes.POINTER(ctypes.c_float))
        c.flags = A.KVA_KV_SCALE_PER_TENSOR if per_tensor else 0
        return c, tuple(arrs)

    def __repr__(self) -> str:
        where = "device" if self.device else "host"
        return (f"KVDesc({self.dtype.label}, pages={self.num_pages}, page_size="
                f"{self.page_size}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"strides={self.strides}, {where})")


def _host(kv: KVDesc, what: str) -> None:
    if not isinstance(kv, KVDesc):
        raise TypeError(f"{what}: kv must be a KVDesc, not {type(kv).__name__}")
    if kv.device:
        raise NotSupported(errno.ENOTSUP, "this cache is in GPU memory, which the CPU kernels "
                           "cannot read: use the device pointers of kv_desc() with CUDA "
                           "kernels", what)


# ------------------------------------------------------------------- calls


def store_kv(kv: KVDesc, k: np.ndarray, v: np.ndarray, slot_mapping: Any, *,
             dtype: Optional[DTypeLike] = None, k_scale: Any = None,
             v_scale: Any = None) -> None:
    """Write ``n`` tokens' K and V (``[n, num_kv_heads, head_dim]``,
    C-contiguous float32 / float16, or bf16 bits as uint16 with
    ``dtype="bf16"``) to their slots: ``slot_mapping[i] = page * page_size +
    offset`` (int64, vLLM's convention; negative = skip; a list will do).
    Converts to the cache's dtype (fp8 divides by ``k_scale`` / ``v_scale``;
    int8 picks and writes a scale per token and head). Every slot is checked
    before anything is written."""
    _host(kv, "store_kv")
    if not kv.writable:
        raise _einval("store_kv: the cache's arrays are read-only")
    k = _array("k", k)
    v = _array("v", v)
    d = _io_dtype("k", k, dtype)
    if v.dtype != k.dtype:
        raise TypeError(f"k is {k.dtype} but v is {v.dtype}")
    want = (kv.num_kv_heads, kv.head_dim)
    if k.ndim != 3 or k.shape[1:] != want or v.shape != k.shape:
        raise _einval(f"k and v must be [n, {want[0]}, {want[1]}], not {k.shape} and {v.shape}")
    _contiguous("k", k)
    _contiguous("v", v)
    n = k.shape[0]
    if n > I32:
        raise _einval("more than 2^31 tokens")
    if isinstance(slot_mapping, np.ndarray):
        sm = slot_mapping
    else:
        try:
            sm = np.asarray(slot_mapping)
        except (TypeError, ValueError):
            raise TypeError("slot_mapping must be an int64 array") from None
    if sm.dtype != np.int64:
        if sm.dtype.kind not in "iu":
            raise TypeError(f"slot_mapping must be int64, not {sm.dtype}")
        if sm.dtype == np.uint64 and sm.size and int(sm.max()) >= 1 << 63:
            raise _einval("slot_mapping: a slot is past int64")
        sm = sm.astype(np.int64)
    if sm.shape != (n,):
        raise _einval(f"slot_mapping must be [{n}], not {sm.shape}")
    sm = np.ascontiguousarray(sm)
    c, keep = kv._with_fp8_scales(k_scale, v_scale)
    ret = _lib.lib().kva_store_kv(ctypes.byref(c), k.ctypes.data, v.ctypes.data, int(d),
                                  sm.ctypes.data, n)
    del keep
    _lib.check(ret, "kva_store_kv")


def decode(kv: KVDesc, q: np.ndarray, page_table: PageTable, *,
           sm_scale: Optional[float] = None, return_lse: bool = False,
           dtype: Optional[DTypeLike] = None, out: Optional[np.ndarray] = None,
           k_scale: Any = None, v_scale: Any = None, threads: int = 0,
           split_tokens: int = 0, max_splits: int = 0,
           isa: str = "auto", pf_step: int = 0) -> Union[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """One decode step: for each sequence ``b`` of the page table and query
    head ``h``, ``out[b, h] = softmax(sm_scale * q[b, h] . K_b) V_b`` over the
    sequence's tokens, with K/V head ``h // (num_q_heads // num_kv_heads)``
    (GQA), accumulated in float32.

    ``q``: ``[batch, num_q_heads, head_dim]`` C-contiguous float32 / float16
    (bf16 bits as uint16 with ``dtype="bf16"``). ``sm_scale`` defaults to
    ``1/sqrt(head_dim)``. Returns a new array like ``q`` (or fills ``out``),
    and with ``return_lse`` also ``lse`` ``[batch, num_q_heads]`` float32
    (natural log; ``-inf`` for an empty sequence, whose output is 0).
    ``threads`` (0: :func:`kernel_threads`), ``split_tokens``, ``max_splits``,
    ``isa`` (``"auto"``, ``"scalar"``, ``"avx2"``, ``"avx512"``) and ``pf_step``
    (the AVX2 path's prefetch step, 1..48; 0: chosen for this CPU) are
    ``struct kva_decode_opts``; results depend on neither ``threads`` nor
    ``pf_step``.
    """
    _host(kv, "decode")
    q = _array("q", q)
    d = _io_dtype("q", q, dtype)
    if not isinstance(page_table, PageTable):
        raise TypeError(f"page_table must be a PageTable, not {type(page_table).__name__}")
    if q.ndim != 3:
        raise _einval(f"q must be [batch, num_q_heads, head_dim], not {q.shape}")
    batch, heads, dim = q.shape
    _contiguous("q", q)
    if dim != kv.head_dim:
        raise _einval(f"q's head_dim is {dim}; the cache's is {kv.head_dim}")
    if batch != page_table.batch:
        raise _einval(f"q has {batch} sequences; the page table {page_table.batch}")
    if heads < 1 or heads % kv.num_kv_heads or heads // kv.num_kv_heads > MAX_GROUP:
        raise _einval(f"num_q_heads {heads} must be a multiple of num_kv_heads "
                      f"{kv.num_kv_heads}, at most {MAX_GROUP} times it")
    if page_table.page_size != kv.page_size:
        raise _einval(f"the page table's page_size is {page_table.page_size}; the cache's "
                      f"{kv.page_size}")
    used = int(page_table.indptr[-1])
    if used and int(page_table.indices[:used].max()) >= kv.num_pages:
        raise _einval(f"a page id of the page table is past the cache's {kv.num_pages} pages")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(dim)
    try:
        scale = float(sm_scale)
    except (TypeError, ValueError):
        raise TypeError(f"sm_scale must be a number, not {type(sm_scale).__name__}") from None
    if not math.isfinite(scale) or scale == 0.0 or abs(scale) > 1e30:
        raise _einval("sm_scale must be finite and not 0")
    if out is None:
        out = np.empty(q.shape, dtype=q.dtype)
    else:
        out = _array("out", out)
        if out.shape != q.shape or out.dtype != q.dtype:
            raise _einval(f"out must be {q.dtype} {q.shape}, not {out.dtype} {out.shape}")
        _contiguous("out", out)
        if not out.flags.writeable:
            raise _einval("out is read-only")
    lse = np.empty((batch, heads), np.float32) if return_lse else None
    if isa not in ISAS:
        raise _einval(f"isa must be one of {', '.join(ISAS)}, not {isa!r}")
    opts = A.kva_decode_opts(as_int("threads", threads, 0, 256),
                             as_int("split_tokens", split_tokens, 0, I32),
                             as_int("max_splits", max_splits, 0, I32), ISAS[isa],
                             as_int("pf_step", pf_step, 0, 48))
    c, keep = kv._with_fp8_scales(k_scale, v_scale)
    pt = page_table._c()
    ret = _lib.lib().kva_decode(ctypes.byref(c), ctypes.byref(pt), q.ctypes.data, int(d),
                                heads, scale, out.ctypes.data,
                                lse.ctypes.data if lse is not None else None,
                                ctypes.byref(opts))
    del keep
    _lib.check(ret, "kva_decode")
    return (out, lse) if lse is not None else out


def kernel_threads() -> int:
    """Threads a decode uses by default: the CPUs this process may run on,
    or ``$KVARENA_THREADS``."""
    return int(_lib.lib().kva_kernel_threads())


def isa_best() -> str:
    """The best vector ISA of this CPU the kernels use: avx512, avx2 or scalar."""
    lib = _lib.lib()
    return lib.kva_isa_name(lib.kva_isa_best()).decode()


def decode_tile(head_dim: int, group: int, isa: str = "auto") -> str:
    """The tile :func:`decode` runs for ``isa`` at ``head_dim`` with ``group``
    query heads per KV head on this CPU: ``"avx512"``, ``"avx2"`` or
    ``"scalar"`` (``kva_decode_tile``). On a core that splits 512-bit
    operations (AMD Zen 4) the avx512 path runs the avx2 tile for groups 3,
    4 and 6-8. Raises :class:`InvalidArgument` (with the library's sentence)
    for arguments out of range, a head_dim the path does not take, or an isa
    this CPU lacks."""
    if isa not in ISAS:
        raise _einval(f"decode_tile: isa must be one of {sorted(ISAS)}")
    name = _lib.lib().kva_decode_tile(ISAS[isa], as_int("head_dim", head_dim, 1, MAX_HEAD_DIM),
                                      as_int("group", group, 1, MAX_GROUP))
    if name is None:
        raise _einval(_lib.errmsg())
    return name.decode()
