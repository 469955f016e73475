# SPDX-License-Identifier: MIT
"""A worker: this process's slot in an agent's arena (``kva_attach``).

Lifetime and safety rules, which every method follows:

- A :class:`Worker` is safe to share between threads: each call takes the
  worker's lock (the C library wants one thread at a time per worker). The
  kernels (:meth:`Worker.decode`, :meth:`Worker.store_kv`) do not take it,
  and run with the GIL released.
- After :meth:`Worker.detach` every method raises :class:`~kvarena.Closed`;
  none touches the library's memory again. Detach closes the worker's open
  sequences first, as the library requires.
- numpy views of blocks (:meth:`Worker.block_kv`, :meth:`Worker.kv_cache`)
  and descriptors (:meth:`Worker.kv_desc`) map the arena's data region
  themselves (a second mapping of the same shared memory, made once per
  worker): they are zero-copy, and stay valid memory after detach, until the
  last of them is gone; no Python call can make them dangle. After detach
  (or after freeing a block) they show whatever the arena holds there now.
- A worker belongs to the process that attached it: in a forked child every
  call raises :class:`~kvarena.Closed` (attach again in the child), and the
  child's detach leaves the parent's slot alone.
"""
from __future__ import annotations

import atexit
import ctypes
import errno
import mmap
import os
import threading
import weakref
from ctypes import byref, c_uint32, c_void_p
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _abi as A
from . import _lib
from ._args import U32, as_ids, as_int, buffer_bytes, cstr
from .dtypes import Backend, DType, DTypeLike
from .errors import Closed, InvalidArgument, NoSpace, NotSupported, error_for
from .kernels import KVDesc, PageTable
from .kernels import decode as _decode
from .kernels import store_kv as _store_kv
from .stats import (
    ArenaInfo,
    AttachTimes,
    CheckReport,
    PrefixStats,
    SeqSlotStats,
    Stats,
    TiersStats,
)

if TYPE_CHECKING:
    from .seq import OwnerKindLike, Seq

__all__ = ["Worker", "attach", "default_socket"]

PathLike = Union[str, bytes, "os.PathLike[str]"]

# bumped in a forked child: a worker of another generation is the parent's
_fork_gen = 0
_workers: "weakref.WeakSet[Worker]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _fork_gen
    _fork_gen += 1
    for w in list(_workers):
        # a lock some other thread of the parent held at fork is never released here
        w._lock = threading.Lock()
        w._hlock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _detach_all() -> None:
    for w in list(_workers):
        try:
            w.detach()
        except Exception:  # noqa: BLE001 - at exit, nothing to report to
            pass


def default_socket() -> str:
    """The socket :func:`attach` uses when given none: ``$KVARENA_SOCKET``,
    else ``/run/kvarena/kvarena.sock``."""
    return _lib.lib().kva_default_socket().decode("utf-8", "replace")


def attach(socket: Optional[PathLike] = None, name: str = "python") -> "Worker":
    """Attach to the kvarena-agent listening on ``socket`` (default:
    :func:`default_socket`): a worker slot and the arena's memory, mapped.
    After this no arena call talks to the agent.

    ``name`` (printable UTF-8, at most 31 bytes) is what ``kvarena-ctl
    workers`` shows. Use the worker as a context manager to detach on exit::

        with kvarena.attach("/run/kvarena/gpu0.sock", "engine-0") as w:
            ids = w.alloc(4)

    Raises :class:`~kvarena.AgentNotFound` (no agent there),
    :class:`~kvarena.AccessDenied`, :class:`~kvarena.NoSlots`,
    :class:`~kvarena.QuotaExceeded` (the agent's slots per process or user),
    :class:`~kvarena.ShuttingDown`, :class:`~kvarena.ProtocolError`, ...,
    each with the agent's reason.
    """
    path: Optional[bytes]
    if socket is None:
        path = None
    else:
        try:
            path = os.fsencode(socket)
        except TypeError:
            raise TypeError(f"socket must be a path, not {type(socket).__name__}") from None
        if b"\0" in path or not path:
            raise InvalidArgument(errno.EINVAL, "socket: an empty path or one with a NUL byte")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    raw = cstr("name", name, 31)
    assert raw is not None
    if not name.isprintable():
        raise InvalidArgument(errno.EINVAL, "name must be printable")
    lib = _lib.lib()
    handle = c_void_p()
    ret = lib.kva_attach(path, raw, byref(handle))
    if ret < 0:
        raise _lib.fail(ret, "kva_attach", attaching=True)
    sock = os.fsdecode(path) if path is not None else default_socket()
    return Worker._adopt(handle.value, sock, name)


class Worker:
    """This process's slot in an agent's arena. Made by :func:`attach`.

    Attributes fixed at attach: :attr:`info` (the arena's geometry, layout,
    size, backend), :attr:`slot`, :attr:`name`, :attr:`socket`, :attr:`pid`.
    """

    info: ArenaInfo
    slot: int
    name: str
    socket: str
    pid: int

    def __init__(self) -> None:
        raise TypeError("workers are made by kvarena.attach()")

    @classmethod
    def _adopt(cls, handle: int, socket: str, name: str) -> "Worker":
        self = object.__new__(cls)
        lib = _lib.lib()
        self._h: Optional[int] = handle
        self._lock = threading.Lock()
        self._hlock = threading.RLock()  # taking a sequence's handle (Seq._take)
        self._gen = _fork_gen
        self.pid = os.getpid()
        self.socket = socket
        self.name = name
        self._arena: int = lib.kva_worker_arena(handle)
        self._cinfo = A.kva_arena_info.from_buffer_copy(lib.kva_arena_info(self._arena).contents)
        self.info = ArenaInfo._from(self._cinfo)
        self.slot = lib.kva_worker_slot(handle)
        self._seqs: "weakref.WeakValueDictionary[int, Seq]" = weakref.WeakValueDictionary()
        self._orphans: list[int] = []  # handles of sequences dropped unclosed
        self._map: Optional[mmap.mmap] = None
        self._anchor: Optional[ctypes.Array] = None  # an export of _map: keeps it mapped
        self._offsets: dict[tuple[int, int, int], int] = {}
        self._descs: dict[int, KVDesc] = {}
        _workers.add(self)
        return self

    # ------------------------------------------------------------ plumbing

    def _enter(self, what: str) -> int:
        """The handle, with the lock held; raise if detached or forked."""
        h = self._h
        if h is None:
            raise Closed(errno.EBADF, "the worker is detached", what)
        if self._gen != _fork_gen:
            raise Closed(errno.EBADF, f"this worker belongs to process {self.pid}; a forked "
                         "child must attach its own", what)
        if self._orphans:
            self._close_orphans()
        return h

    def _close_orphans(self) -> None:
        lib = _lib.lib()
        while self._orphans:
            lib.kva_seq_close(self._orphans.pop())

    def _call(self, what: str, fn: str, *args: Any) -> int:
        """``lib.fn(handle, *args)`` under the lock; raise on a negative return."""
        with self._lock:
            h = self._enter(what)
            ret = getattr(_lib.lib(), fn)(h, *args)
            if ret < 0:
                raise _lib.fail(ret, fn)
        return ret

    def _arena_call(self, what: str, fn: str, *args: Any) -> int:
        """``lib.fn(arena, *args)`` under the lock (the arena lives while attached)."""
        with self._lock:
            self._enter(what)
            ret = getattr(_lib.lib(), fn)(self._arena, *args)
            if ret < 0:
                raise _lib.fail(ret, fn)
        return ret

    @property
    def closed(self) -> bool:
        """Whether the worker is detached."""
        return self._h is None

    @property
    def blocks(self) -> int:
        """Blocks in the arena (block ids are 0..blocks-1)."""
        return self.info.blocks

    @property
    def block_tokens(self) -> int:
        """Tokens per block (page size)."""
        return self.info.geometry.block_tokens

    @property
    def dtype(self) -> DType:
        """The arena's element type."""
        return self.info.geometry.dtype

    # -------------------------------------------------------------- blocks

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` blocks exclusively; all or nothing. Returns their ids.

        Raises :class:`~kvarena.NoSpace` (fewer than ``n`` free or evictable
        blocks), :class:`~kvarena.StaleWorker`, :class:`~kvarena.ShuttingDown`.
        """
        n = as_int("n", n, 0, U32)
        if n == 0:
            return []
        if n > self.info.blocks:
            raise NoSpace(errno.ENOSPC, f"alloc of {n} blocks: the arena has "
                          f"{self.info.blocks}", "kva_alloc")
        ids = (c_uint32 * n)()
        self._call("alloc", "kva_alloc", n, ids)
        return list(ids)

    def free(self, ids: Any) -> None:
        """Drop one reference per id (an exclusive block has one); all or
        nothing. An id may repeat as often as this worker holds it.

        Raises :class:`~kvarena.NotPermitted` (a block not held: double or
        foreign free), :class:`~kvarena.InvalidArgument` (out of range).
        """
        arr = as_ids(ids, self.info.blocks)
        if arr.size:
            if arr.size > U32:
                raise InvalidArgument(errno.EINVAL, "more than 2^32 ids", "kva_free")
            self._call("free", "kva_free", arr.ctypes.data, arr.size)

    def share(self, ids: Any) -> None:
        """Take one more reference per id; all or nothing. A block of this
        worker becomes shared (another worker may then share it too); a block
        another worker shared gains this worker as a holder.

        Raises :class:`~kvarena.NotPermitted` (another worker's exclusive block).
        """
        arr = as_ids(ids, self.info.blocks)
        if arr.size:
            if arr.size > U32:
                raise InvalidArgument(errno.EINVAL, "more than 2^32 ids", "kva_share")
            self._call("share", "kva_share", arr.ctypes.data, arr.size)

    def set_cache(self, blocks: int) -> None:
        """This worker's private cache capacity (0 = none, at most 65536)."""
        self._call("set_cache", "kva_worker_set_cache", as_int("blocks", blocks, 0, U32))

    # --------------------------------------------------------- block bytes

    def _check_block(self, block: int, layer: Optional[int] = None) -> tuple[int, int]:
        g = self.info.geometry
        block = as_int("block", block, 0, self.info.blocks - 1)
        layer = as_int("layer", layer, 0, g.layers - 1) if layer is not None else 0
        return block, layer

    def _mapping(self, what: str) -> mmap.mmap:
        """Our own mapping of the data region (made once)."""
        with self._lock:
            self._enter(what)
            if self._map is not None:
                return self._map
            if self.info.backend != Backend.HOST:
                raise NotSupported(errno.EMEDIUMTYPE, "the arena's blocks are in GPU memory, "
                                   "which numpy cannot view: use block_kv_ptr() or kv_desc() "
                                   "for device pointers, block_read()/block_write() to copy",
                                   what)
            fd = _lib.lib().kva_arena_data_fd(self._arena)
            if fd < 0:
                raise _lib.fail(fd, "kva_arena_data_fd")
            size = os.fstat(fd).st_size
            need = self.info.layout.data_bytes
            if size < need:
                raise NotSupported(errno.EINVAL, f"the data region is {size} bytes, the layout "
                                   f"needs {need}", what)
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._anchor = (ctypes.c_char * size).from_buffer(m)
            self._map = m
            return m

    def _offset(self, layer: int, kv: int, scales: int) -> int:
        """Byte offset of block 0's page of ``layer`` (K or V, or its scales)."""
        key = (layer, kv, scales)
        off = self._offsets.get(key)
        if off is None:
            c = self._cinfo
            off = _lib.lib().kva_kv_offset(byref(c.geometry), byref(c.layout), c.blocks, 0,
                                           layer, kv, scales)
            self._offsets[key] = off
        return off

    def _view(self, m: mmap.mmap, off: int, shape: tuple[int, ...], dtype: np.dtype,
              strides: tuple[int, ...]) -> np.ndarray:
        # numpy checks the whole strided extent lies inside the mapping
        return np.ndarray(shape, dtype=dtype, buffer=m, offset=off, strides=strides)

    def block_kv(self, block: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``layer`` of block ``block`` as numpy views ``(k, v)`` of the
        arena memory (zero copy, writable), each ``[kv_heads, block_tokens,
        head_dim]`` (the page's own order; strides are the layout's).

        dtype: f32 → float32, f16 → float16, bf16 → **uint16** (the bits;
        :func:`kvarena.bf16_to_float32`), fp8 e4m3 → **uint8** (the bits;
        :func:`kvarena.fp8_e4m3_to_float32`), int8 → int8 (its scales:
        :meth:`block_scales`). The views keep the memory mapped after detach
        (see the module's rules). A GPU arena raises
        :class:`~kvarena.NotSupported`: use :meth:`block_kv_ptr`.
        """
        block, layer = self._check_block(block, layer)
        m = self._mapping("block_kv")
        g, lay = self.info.geometry, self.info.layout
        shape = (g.kv_heads, g.block_tokens, g.head_dim)
        strides = (lay.head_stride, lay.token_stride, lay.elem_bytes)
        step = block * lay.page_stride
        return (self._view(m, self._offset(layer, 0, 0) + step, shape, g.dtype.numpy, strides),
                self._view(m, self._offset(layer, 1, 0) + step, shape, g.dtype.numpy, strides))

    def kv_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``layer``'s whole paged cache as numpy views ``(k, v)``, each
        ``[blocks, kv_heads, block_tokens, head_dim]`` (FlashInfer's HND;
        index by block id). Zero copy; dtypes as :meth:`block_kv`."""
        layer = as_int("layer", layer, 0, self.info.geometry.layers - 1)
        m = self._mapping("kv_cache")
        g, lay = self.info.geometry, self.info.layout
        shape = (self.info.blocks, g.kv_heads, g.block_tokens, g.head_dim)
        strides = (lay.page_stride, lay.head_stride, lay.token_stride, lay.elem_bytes)
        return (self._view(m, self._offset(layer, 0, 0), shape, g.dtype.numpy, strides),
                self._view(m, self._offset(layer, 1, 0), shape, g.dtype.numpy, strides))

    def block_scales(self, block: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """An int8 arena's scales of one block and layer: float32 views
        ``(k_scale, v_scale)``, each ``[kv_heads, block_tokens]``; a stored
        value ``x`` means ``x * scale``. Other dtypes raise InvalidArgument."""
        block, layer = self._check_block(block, layer)
        g, lay = self.info.geometry, self.info.layout
        if g.dtype != DType.INT8:
            raise InvalidArgument(errno.EINVAL, f"no scales in a {g.dtype.label} arena",
                                  "block_scales")
        m = self._mapping("block_scales")
        shape = (g.kv_heads, g.block_tokens)
        strides = (4 * g.block_tokens, 4)  # [kv_head][token] floats (kva_kv_desc_for_arena)
        step = block * lay.scale_stride
        f32 = np.dtype(np.float32)
        return (self._view(m, self._offset(layer, 0, 1) + step, shape, f32, strides),
                self._view(m, self._offset(layer, 1, 1) + step, shape, f32, strides))

    def scale_cache(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """An int8 arena's scales of layer ``layer`` for every block: float32
        views ``(k_scale, v_scale)``, each ``[blocks, kv_heads, block_tokens]``."""
        layer = as_int("layer", layer, 0, self.info.geometry.layers - 1)
        g, lay = self.info.geometry, self.info.layout
        if g.dtype != DType.INT8:
            raise InvalidArgument(errno.EINVAL, f"no scales in a {g.dtype.label} arena",
                                  "scale_cache")
        m = self._mapping("scale_cache")
        shape = (self.info.blocks, g.kv_heads, g.block_tokens)
        strides = (lay.scale_stride, 4 * g.block_tokens, 4)
        f32 = np.dtype(np.float32)
        return (self._view(m, self._offset(layer, 0, 1), shape, f32, strides),
                self._view(m, self._offset(layer, 1, 1), shape, f32, strides))

    def block_kv_ptr(self, block: int, layer: int) -> tuple[int, int]:
        """``kva_block_kv``: the addresses of layer ``layer``'s K and V pages of
        ``block`` in the library's mapping, as ints: device pointers on a
        GPU arena (for CUDA code), host addresses otherwise. Valid until
        detach; the binding cannot protect what is done with them."""
        block, layer = self._check_block(block, layer)
        k, v = c_void_p(), c_void_p()
        self._call("block_kv_ptr", "kva_block_kv", block, layer, byref(k), byref(v))
        return int(k.value or 0), int(v.value or 0)

    def _range(self, offset: int, n: Optional[int]) -> tuple[int, int]:
        size = self.info.layout.block_bytes
        offset = as_int("offset", offset, 0, size)
        n = size - offset if n is None else as_int("n", n, 0, size - offset)
        return offset, n

    def block_read(self, block: int, offset: int = 0, n: Optional[int] = None) -> bytes:
        """``n`` bytes (default: to the end) of block ``block``'s contents from
        ``offset``: every layer's K page then V page, layer by layer, then
        (int8) the scales. Works on a GPU arena too (a synchronous copy)."""
        block, _ = self._check_block(block)
        offset, n = self._range(offset, n)
        buf = np.empty(n, np.uint8)
        if n:
            self._call("block_read", "kva_block_read", block, offset, buf.ctypes.data, n)
        return buf.tobytes()

    def block_read_into(self, block: int, buf: Any, offset: int = 0) -> int:
        """Fill the writable, contiguous buffer ``buf`` (bytearray, numpy
        array, memoryview) from block ``block`` at ``offset``; returns its length."""
        block, _ = self._check_block(block)
        dst = buffer_bytes("buf", buf)
        if not dst.flags.writeable:
            raise InvalidArgument(errno.EINVAL, "buf is read-only", "block_read_into")
        offset, n = self._range(offset, dst.size)
        if n:
            self._call("block_read_into", "kva_block_read", block, offset, dst.ctypes.data, n)
        return n

    def block_write(self, block: int, offset: int, data: Any) -> None:
        """Copy ``data`` (bytes, bytearray, memoryview, contiguous numpy array)
        into block ``block``'s contents at ``offset`` (the order of
        :meth:`block_read`). Works on a GPU arena too."""
        block, _ = self._check_block(block)
        src = buffer_bytes("data", data)
        offset, n = self._range(offset, src.size)
        if n:
            self._call("block_write", "kva_block_write", block, offset, src.ctypes.data, n)

    # ------------------------------------------------------------- kernels

    def kv_desc(self, layer: int) -> KVDesc:
        """The kernels' descriptor of layer ``layer`` (block ids are page ids),
        for :func:`kvarena.kernels.decode` and :func:`kvarena.kernels.store_kv`.
        On a host arena it points into this binding's own mapping and keeps it
        alive; on a GPU arena it holds device pointers (``.pointers``) valid
        until detach, and the CPU kernels refuse it."""
        layer = as_int("layer", layer, 0, self.info.geometry.layers - 1)
        desc = self._descs.get(layer)
        if desc is not None and self._h is not None:
            return desc
        device = self.info.backend != Backend.HOST
        if not device:
            self._mapping("kv_desc")
        c = A.kva_kv_desc()
        with self._lock:
            self._enter("kv_desc")
            lib = _lib.lib()
            _lib.check(lib.kva_kv_desc_for_arena(self._arena, layer, byref(c)),
                       "kva_kv_desc_for_arena")
            if device:
                return KVDesc._make(c, (), device=True)
            # the same offsets, in our mapping: base = block 0's layer 0 K page - its offset
            lib_base = int(lib.kva_block_data(self._h, 0)) - self._offset(0, 0, 0)
            anchor = self._anchor
            assert anchor is not None
            ours = ctypes.addressof(anchor)
            size = ctypes.sizeof(anchor)
            fp = ctypes.POINTER(ctypes.c_float)
            for name in ("k", "v", "k_scale", "v_scale"):
                p = getattr(c, name)
                addr = p if isinstance(p, int) or p is None else ctypes.cast(p, c_void_p).value
                if not addr:
                    continue
                off = addr - lib_base
                if not 0 <= off < size:
                    raise NotSupported(errno.EFAULT, f"kv_desc: {name} lies outside the data "
                                       "region", "kv_desc")
                setattr(c, name, ours + off if name in ("k", "v") else
                        ctypes.cast(ours + off, fp))
            desc = KVDesc._make(c, (anchor,), device=False)
            self._descs[layer] = desc
            return desc

    def store_kv(self, layer: int, k: np.ndarray, v: np.ndarray, slot_mapping: Any, *,
                 dtype: Optional[DTypeLike] = None, k_scale: Any = None,
                 v_scale: Any = None) -> None:
        """:func:`kvarena.kernels.store_kv` into layer ``layer`` of the arena:
        ``k``, ``v`` ``[n, kv_heads, head_dim]``, ``slot_mapping[i] = block_id *
        block_tokens + offset`` (see :meth:`Seq.slots`); fp8 arenas need
        ``k_scale`` / ``v_scale``."""
        _store_kv(self.kv_desc(layer), k, v, slot_mapping, dtype=dtype, k_scale=k_scale,
                  v_scale=v_scale)

    def decode(self, layer: int, q: np.ndarray, page_table: PageTable, *,
               sm_scale: Optional[float] = None, return_lse: bool = False,
               dtype: Optional[DTypeLike] = None, out: Optional[np.ndarray] = None,
               k_scale: Any = None, v_scale: Any = None, threads: int = 0,
               split_tokens: int = 0, max_splits: int = 0, isa: str = "auto",
               pf_step: int = 0) -> Union[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """:func:`kvarena.kernels.decode` over layer ``layer`` of the arena
        (block ids are page ids): ``q`` ``[batch, num_q_heads, head_dim]``;
        returns ``out`` (like ``q``) or, with ``return_lse``, ``(out, lse)``."""
        return _decode(self.kv_desc(layer), q, page_table, sm_scale=sm_scale,
                       return_lse=return_lse, dtype=dtype, out=out, k_scale=k_scale,
                       v_scale=v_scale, threads=threads, split_tokens=split_tokens,
                       max_splits=max_splits, isa=isa, pf_step=pf_step)

    # ----------------------------------------------------------- sequences

    def open_seq(self, kind: "OwnerKindLike" = "inference", *, model: Optional[str] = None,
                 adapter: Optional[str] = None, tenant: int = 0, run_id: int = 0,
                 reserve_tokens: int = 0, max_tokens: int = 0) -> "Seq":
        """A new empty sequence (``kva_seq_open``): see :class:`kvarena.Seq`.

        ``kind``: ``"inference"``, ``"training"`` (of ``run_id``) or ``"pinned"``;
        ``model``, ``adapter``, ``tenant``: the salt (prefixes are shared only
        between sequences of the same salt; ``tenant`` is also a quota key);
        ``reserve_tokens``: reserved now, all or nothing; ``max_tokens``: 0 =
        no maximum. Raises :class:`~kvarena.NoSpace`,
        :class:`~kvarena.QuotaExceeded` (the initial reservation).
        """
        from .seq import Seq

        return Seq._open(self, kind, model, adapter, tenant, run_id, reserve_tokens,
                         max_tokens)

    @property
    def open_seqs(self) -> list["Seq"]:
        """This worker's open sequences."""
        return [s for s in self._seqs.values() if not s.closed]

    # --------------------------------------------------------------- stats

    def stats(self) -> Stats:
        """Allocator counts (``kva_stats``): one pass over the descriptors."""
        st = A.kva_stats()
        self._call("stats", "kva_stats", byref(st))
        return Stats._from(st)

    def prefix_stats(self) -> PrefixStats:
        """The prefix cache's counters (``kvarena-ctl prefix``)."""
        st = A.kva_prefix_stats()
        self._arena_call("prefix_stats", "kva_arena_prefix_stats", byref(st))
        return PrefixStats._from(st)

    def seq_stats(self, slot: Optional[int] = None) -> SeqSlotStats:
        """One worker's sequences (default: this one's): open, held, hits."""
        slot = self.slot if slot is None else as_int("slot", slot, 0, self.info.max_workers - 1)
        st = A.kva_seq_slot_stats()
        self._arena_call("seq_stats", "kva_arena_seq_stats", slot, byref(st))
        return SeqSlotStats._from(st)

    def tier_stats(self) -> TiersStats:
        """The spill tiers below the arena (``kvarena-ctl tiers``)."""
        st = A.kva_tiers_stats()
        self._arena_call("tier_stats", "kva_arena_tier_stats", byref(st))
        return TiersStats._from(st)

    def check(self) -> CheckReport:
        """``kva_arena_check``: the global invariant, exact when no worker is
        inside an arena call. A breach is ``ok=False`` (not an exception)."""
        r = A.kva_check_report()
        with self._lock:
            self._enter("check")
            ret = _lib.lib().kva_arena_check(self._arena, byref(r))
            if ret < 0 and ret != -errno.EUCLEAN:
                raise _lib.fail(ret, "kva_arena_check")
        return CheckReport._from(r, ret == 0)

    def map(self, cells: Optional[int] = None) -> str:
        """The block map, one character per block (or per run of blocks when
        ``cells`` is smaller): ``.`` free, ``#`` shared, ``+`` cached prefix,
        a slot's character for a block it holds, ``!`` corrupt."""
        cells = self.info.blocks if cells is None else as_int("cells", cells, 1, self.info.blocks)
        buf = ctypes.create_string_buffer(cells + 1)
        n = self._arena_call("map", "kva_arena_map", buf, cells + 1, cells)
        return buf.raw[:n].decode("ascii", "replace")

    def attach_times(self) -> AttachTimes:
        """Where ``kva_attach`` spent its time."""
        t = A.kva_attach_times()
        self._call("attach_times", "kva_worker_attach_times", byref(t))
        return AttachTimes._from(t)

    # --------------------------------------------------------------- agent

    def fileno(self) -> int:
        """The agent connection, for ``selectors`` / ``asyncio``: when it is
        readable, call :meth:`poll`."""
        return self._call("fileno", "kva_worker_fd")

    def poll(self) -> None:
        """What the agent said (``kva_worker_poll``): returns if nothing;
        raises :class:`~kvarena.ShuttingDown` (the agent is stopping: free and
        detach; new allocations already fail) or :class:`~kvarena.AgentGone`
        (the agent died: memory keeps working, but nobody will reclaim this
        worker if it dies)."""
        with self._lock:
            h = self._enter("poll")
            ret = _lib.lib().kva_worker_poll(h)
        if ret == -errno.ESHUTDOWN:
            raise error_for(errno.ESHUTDOWN, "the agent is stopping: free what you hold and "
                            "detach", "kva_worker_poll")
        if ret == -errno.ECONNRESET:
            raise error_for(errno.ECONNRESET, "the agent is gone: the arena keeps working, "
                            "but no one reclaims a worker that dies now", "kva_worker_poll")
        if ret < 0:
            raise _lib.fail(ret, "kva_worker_poll")

    # ------------------------------------------------------------ lifetime

    def detach(self) -> None:
        """Close this worker's open sequences, give back everything it holds
        (its cache included), tell the agent, unmap. Idempotent; afterwards
        every call raises :class:`~kvarena.Closed`."""
        with self._lock:
            h, self._h = self._h, None
            if h is None:
                return
            ours = self._gen == _fork_gen
            lib = _lib.lib()
            for s in list(self._seqs.values()):
                sh = s._take()
                if sh and ours:
                    lib.kva_seq_close(sh)
            if ours:
                self._close_orphans()
                lib.kva_detach(h)  # a forked child leaves the parent's slot alone
            self._orphans.clear()
            self._descs.clear()
            # views and descriptors made keep their own references to the mapping
            self._anchor = None
            self._map = None
        _workers.discard(self)

    close = detach

    def __reduce__(self) -> Any:
        raise TypeError("a Worker belongs to the process that attached it: attach in the "
                        "other process instead of sending it there")

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __del__(self) -> None:
        try:
            if getattr(self, "_h", None) is not None:
                self.detach()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        i, g = self.info, self.info.geometry
        state = "detached" if self._h is None else f"slot {self.slot}"
        return (f"<kvarena.Worker {self.name!r} {state} of arena {i.name!r}: {i.blocks} blocks "
                f"of {g.block_tokens} tokens x {g.layers} layers x {g.kv_heads} kv heads x "
                f"{g.head_dim} {g.dtype.label}, {i.backend.name.lower()}>")
