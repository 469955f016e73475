# SPDX-License-Identifier: MIT
"""Sequences: one request's KV over arena blocks, with prefix sharing across
processes (``kvarena_seq.h``, ``kvarena_tiers.h``).

The serving pattern, per request::

    with w.open_seq(model="llama-3-8b") as s:
        hit = s.match(prompt)                 # attach the cached prefix, by reference
        s.reserve(len(prompt) - hit + max_new)
        slots = s.slots(hit, len(prompt) - hit)
        w.store_kv(layer, k_new, v_new, slots) # for each layer: K/V of the rest
        s.append(prompt[hit:])                 # full blocks are published for others
        ...                                    # decode: reserve, store, decode, append
    # close: references dropped, published blocks stay cached for later matches

A sequence belongs to its worker; it is closed by :meth:`Seq.close`, by the
``with`` block, by the worker's detach, or (at the worker's next call) when
it is garbage-collected unclosed.
"""
from __future__ import annotations

import enum
import errno
import time
from ctypes import POINTER, byref, c_size_t, c_uint32, c_void_p
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _abi as A
from . import _lib
from ._args import SIZE_MAX, U32, U64, as_int, as_tokens, cstr
from .errors import Closed, InvalidArgument
from .stats import FetchResult, Match

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["Seq", "OwnerKind", "prefix_salt", "prefix_hash", "prefix_keys"]


class OwnerKind(enum.IntEnum):
    """``enum kva_owner_kind``: who a sequence's blocks are held for (quotas
    are per kind; pinned and training blocks are never evicted while open)."""

    INFERENCE = 0
    TRAINING = 1
    PINNED = 2

    @classmethod
    def of(cls, value: "OwnerKindLike") -> "OwnerKind":
        """From an OwnerKind, its number or its name (``"inference"``...)."""
        if isinstance(value, OwnerKind):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise InvalidArgument(errno.EINVAL, f"unknown owner kind {value!r}: inference, "
                                      "training or pinned") from None
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise InvalidArgument(errno.EINVAL, f"unknown owner kind {value}") from None
        raise TypeError(f"kind must be a str or OwnerKind, not {type(value).__name__}")


OwnerKindLike = Union[OwnerKind, str, int]


class Seq:
    """One request's KV: a block table over arena blocks (``struct kva_seq``).

    Made by :meth:`kvarena.Worker.open_seq` (or :meth:`fork`). ``len(seq)``
    is its length in tokens; :meth:`block_table` gives its blocks.
    """

    worker: "Worker"
    kind: OwnerKind
    model: Optional[str]
    adapter: Optional[str]
    tenant: int
    run_id: int
    max_tokens: int

    def __init__(self) -> None:
        raise TypeError("sequences are made by Worker.open_seq()")

    @classmethod
    def _open(cls, w: "Worker", kind: OwnerKindLike, model: Optional[str],
              adapter: Optional[str], tenant: int, run_id: int, reserve_tokens: int,
              max_tokens: int) -> "Seq":
        o = A.kva_seq_opts()
        k = OwnerKind.of(kind)
        o.kind = int(k)
        model_b = cstr("model", model)
        adapter_b = cstr("adapter", adapter)
        o.model, o.adapter = model_b, adapter_b
        o.tenant = as_int("tenant", tenant, 0, U32)
        o.run_id = as_int("run_id", run_id, 0, U64)
        o.reserve_tokens = as_int("reserve_tokens", reserve_tokens, 0, SIZE_MAX)
        o.max_tokens = as_int("max_tokens", max_tokens, 0, SIZE_MAX)
        h = c_void_p()
        with w._lock:
            wh = w._enter("open_seq")
            ret = _lib.lib().kva_seq_open(wh, byref(o), byref(h))
            if ret < 0:
                raise _lib.fail(ret, "kva_seq_open")
            return cls._adopt(w, int(h.value), k, model, adapter, o.tenant, o.run_id,
                              o.max_tokens)

    @classmethod
    def _adopt(cls, w: "Worker", handle: int, kind: OwnerKind, model: Optional[str],
               adapter: Optional[str], tenant: int, run_id: int, max_tokens: int) -> "Seq":
        self = object.__new__(cls)
        self._h: Optional[int] = handle
        self.worker = w
        self.kind, self.model, self.adapter = kind, model, adapter
        self.tenant, self.run_id, self.max_tokens = tenant, run_id, max_tokens
        self._fetching = False
        w._seqs[handle] = self
        return self

    # ------------------------------------------------------------ plumbing

    def _take(self) -> Optional[int]:
        """Take the handle out (once): whoever gets it closes it."""
        with self.worker._hlock:
            h, self._h = self._h, None
            return h

    def _enter(self, what: str) -> int:
        """The sequence's handle, with the worker's lock held."""
        self.worker._enter(what)
        h = self._h
        if h is None:
            raise Closed(errno.EBADF, "the sequence is closed", what)
        return h

    def _call(self, what: str, fn: str, *args: Any) -> int:
        with self.worker._lock:
            h = self._enter(what)
            ret = getattr(_lib.lib(), fn)(h, *args)
            if ret < 0:
                raise _lib.fail(ret, fn)
        return ret

    @property
    def closed(self) -> bool:
        """Whether the sequence is closed (or its worker detached)."""
        return self._h is None or self.worker.closed

    @property
    def block_tokens(self) -> int:
        """Tokens per block of the arena."""
        return self.worker.info.geometry.block_tokens

    # ----------------------------------------------------------- the calls

    def match(self, tokens: Any) -> int:
        """Attach the longest cached prefix of ``tokens`` made of full blocks,
        by reference (any process may have computed it); returns its length
        in tokens (a multiple of the block size, possibly 0). Only on an
        empty sequence (:class:`~kvarena.Busy` otherwise). ``tokens``: a
        list or numpy array of int32 token ids."""
        t = as_tokens(tokens)
        n = c_size_t()
        self._call("match", "kva_seq_match", t.ctypes.data, t.size, byref(n))
        return int(n.value)

    def match_tiers(self, tokens: Any) -> Match:
        """:meth:`match`, and how many tokens more are in the tiers below
        (host memory, disk) for :meth:`fetch` to bring up."""
        t = as_tokens(tokens)
        m = A.kva_match()
        self._call("match_tiers", "kva_seq_match_tiers", t.ctypes.data, t.size, byref(m))
        return Match._from(m)

    def reserve(self, n_tokens: int) -> None:
        """Make room for ``n_tokens`` more tokens past the length; all or
        nothing. Raises :class:`~kvarena.NoSpace`,
        :class:`~kvarena.QuotaExceeded` (the kind's or tenant's quota; the
        message names which), :class:`~kvarena.TooLarge` (past max_tokens)."""
        self._call("reserve", "kva_seq_reserve", as_int("n_tokens", n_tokens, 0, SIZE_MAX))

    def append(self, tokens: Any) -> None:
        """Advance the length by ``len(tokens)`` (reserving what is missing),
        after their K and V are stored. Each block that becomes full is
        published to the prefix index, for every process of the arena."""
        t = as_tokens(tokens)
        self._call("append", "kva_seq_append", t.ctypes.data, t.size)

    def fork(self) -> "Seq":
        """A child sharing every block by reference (beam search, parallel
        sampling); a partial last block is copied by whichever side appends
        to it first. The child has this sequence's kind and salt."""
        h = c_void_p()
        with self.worker._lock:
            sh = self._enter("fork")
            ret = _lib.lib().kva_seq_fork(sh, byref(h))
            if ret < 0:
                raise _lib.fail(ret, "kva_seq_fork")
            return Seq._adopt(self.worker, int(h.value), self.kind, self.model, self.adapter,
                              self.tenant, self.run_id, self.max_tokens)

    def block_table(self) -> tuple[np.ndarray, int]:
        """``(ids, n_tokens)``: the block ids (int32, a copy; reserved blocks
        past the length included) and the length in tokens."""
        ids = POINTER(c_uint32)()
        nb, nt = c_size_t(), c_size_t()
        with self.worker._lock:
            sh = self._enter("block_table")
            _lib.check(_lib.lib().kva_seq_block_table(sh, byref(ids), byref(nb), byref(nt)),
                       "kva_seq_block_table")
            if nb.value == 0:
                return np.zeros(0, np.int32), int(nt.value)
            out = np.ctypeslib.as_array(ids, (nb.value,)).astype(np.int32)
        return out, int(nt.value)

    def __len__(self) -> int:
        return self.block_table()[1]

    def __bool__(self) -> bool:  # an open empty sequence is still a sequence
        return True

    @property
    def n_tokens(self) -> int:
        """The length in tokens (``len(seq)``)."""
        return self.block_table()[1]

    @property
    def n_blocks(self) -> int:
        """Blocks in the table, reserved ones included."""
        return int(self.block_table()[0].shape[0])

    def slots(self, start: int, n: int = 1) -> np.ndarray:
        """The slot mapping (int64 ``block_id * block_tokens + offset``) of
        positions ``start .. start+n-1``, for :meth:`Worker.store_kv`; they
        must be reserved (see :meth:`reserve`)."""
        ids, _ = self.block_table()
        bt = self.block_tokens
        start = as_int("start", start, 0, SIZE_MAX)
        n = as_int("n", n, 0, SIZE_MAX)
        if start + n > ids.shape[0] * bt:
            raise InvalidArgument(errno.EINVAL, f"positions {start}..{start + n - 1} are past "
                                  f"the {ids.shape[0] * bt} tokens reserved", "slots")
        pos = np.arange(start, start + n, dtype=np.int64)
        return ids[pos // bt].astype(np.int64) * bt + pos % bt

    # --------------------------------------------------------------- fetch

    def fetch_start(self, max_tokens: int = 0) -> None:
        """Start bringing up to ``max_tokens`` (0: all) of what the last match
        found below into fresh blocks, through the agent; never waits.
        Raises :class:`~kvarena.NoData` (nothing below), :class:`~kvarena.Busy`
        (the sequence moved since the match), :class:`~kvarena.AgentGone`
        (-ENOTCONN), NoSpace, QuotaExceeded."""
        self._call("fetch_start", "kva_seq_fetch_start", as_int("max_tokens", max_tokens, 0,
                                                                SIZE_MAX))
        self._fetching = True

    def fetch_poll(self) -> Optional[FetchResult]:
        """The fetch's result once it is over (the sequence then includes what
        it brought), else None."""
        r = A.kva_fetch_result()
        with self.worker._lock:
            sh = self._enter("fetch_poll")
            ret = _lib.lib().kva_seq_fetch_poll(sh, byref(r))
            if ret == -errno.EINPROGRESS:
                return None
            if ret < 0:
                raise _lib.fail(ret, "kva_seq_fetch_poll")
        self._fetching = False
        return FetchResult._from(r)

    def fetch_wait(self, timeout: Optional[float] = None) -> Optional[FetchResult]:
        """Wait up to ``timeout`` seconds (None: no limit) for the fetch;
        None if it is still in flight. Waits in slices, so other threads may
        use the worker meanwhile."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        r = A.kva_fetch_result()
        while True:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            ms = max(0, int(left * 1000))
            with self.worker._lock:
                sh = self._enter("fetch_wait")
                ret = _lib.lib().kva_seq_fetch_wait(sh, ms, byref(r))
                if ret < 0 and ret != -errno.ETIMEDOUT:
                    raise _lib.fail(ret, "kva_seq_fetch_wait")
            if ret == 0:
                self._fetching = False
                return FetchResult._from(r)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def fetch_cancel(self) -> FetchResult:
        """End the fetch now: keep the blocks served in order, give up the rest."""
        r = A.kva_fetch_result()
        self._call("fetch_cancel", "kva_seq_fetch_cancel", byref(r))
        self._fetching = False
        return FetchResult._from(r)

    def fetch(self, max_tokens: int = 0, timeout: Optional[float] = 2.0) -> FetchResult:
        """:meth:`fetch_start`, then wait up to ``timeout`` seconds; on time-out
        cancel (a shorter match, nothing more). Returns what it brought."""
        self.fetch_start(max_tokens)
        r = self.fetch_wait(timeout)
        return r if r is not None else self.fetch_cancel()

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Drop every reference (published blocks stay cached for later
        matches). Idempotent; a no-op once the worker is detached."""
        w = self.worker
        with w._lock:
            h = self._take()
            if h is not None and w._h is not None and w._gen == _fork_gen():
                _lib.lib().kva_seq_close(h)

    def __reduce__(self) -> Any:
        raise TypeError("a Seq belongs to its worker's process; it cannot be pickled")

    def __enter__(self) -> "Seq":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            h = self._take()
            if h is not None:
                # closed at the worker's next call (never from here: a
                # finalizer may run while this thread holds the worker's lock)
                self.worker._orphans.append(h)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        if self.closed:
            return f"<kvarena.Seq {self.kind.name.lower()} closed>"
        try:
            ids, n = self.block_table()
        except Exception:  # noqa: BLE001 - repr must not raise
            return f"<kvarena.Seq {self.kind.name.lower()}>"
        salt = ", ".join(f"{k}={v!r}" for k, v in (("model", self.model),
                         ("adapter", self.adapter)) if v) or "no salt"
        return (f"<kvarena.Seq {self.kind.name.lower()} {n} tokens in {ids.shape[0]} blocks "
                f"({salt}, tenant {self.tenant}) of worker slot {self.worker.slot}>")


def _fork_gen() -> int:
    from . import worker

    return worker._fork_gen


# ------------------------------------------------------------------ hashes


def prefix_salt(model: Optional[str] = None, adapter: Optional[str] = None,
                tenant: int = 0) -> int:
    """The 128-bit salt of (model, adapter, tenant) (``kva_prefix_salt``), as
    an int (low word | high word << 64). The same in every process."""
    out = (A.c_uint64 * 2)()
    _lib.lib().kva_prefix_salt(cstr("model", model), cstr("adapter", adapter),
                               as_int("tenant", tenant, 0, U32), out)
    return int(out[0]) | int(out[1]) << 64


def prefix_hash(parent: int, salt: int, tokens: Any) -> int:
    """One block's 128-bit key (``kva_prefix_hash``): of its parent's key (0
    for the first block), the salt and its token ids."""
    p = (A.c_uint64 * 2)(*_words("parent", parent))
    s = (A.c_uint64 * 2)(*_words("salt", salt))
    t = as_tokens(tokens)
    out = (A.c_uint64 * 2)()
    _lib.lib().kva_prefix_hash(p, s, t.ctypes.data, t.size, out)
    return int(out[0]) | int(out[1]) << 64


def prefix_keys(tokens: Any, block_tokens: int, model: Optional[str] = None,
                adapter: Optional[str] = None, tenant: int = 0) -> list[int]:
    """The keys of every full block of ``tokens``: what a match looks up."""
    t = as_tokens(tokens)
    bt = as_int("block_tokens", block_tokens, 1, 65536)
    salt = prefix_salt(model, adapter, tenant)
    keys, parent = [], 0
    for i in range(t.size // bt):
        parent = prefix_hash(parent, salt, t[i * bt:(i + 1) * bt])
        keys.append(parent)
    return keys


def _words(name: str, v: int) -> tuple[int, int]:
    v = as_int(name, v, 0, (1 << 128) - 1)
    return v & U64, v >> 64
