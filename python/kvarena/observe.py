# SPDX-License-Identifier: MIT
"""A read-only view of an agent's arena for ops tools (``kva_observe``): no
worker slot, no connection kept; stats, prefix and tier counters, the block
map and the invariant check, as ``kvarena-ctl`` shows them."""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from ctypes import byref, c_int32, c_void_p
from typing import Any, Optional

from . import _abi as A
from . import _lib
from ._args import as_int, U32
from .errors import Closed, InvalidArgument
from .stats import (
    AgentInfo,
    ArenaInfo,
    CheckReport,
    PrefixStats,
    SeqSlotStats,
    Stats,
    TiersStats,
)

__all__ = ["Observer", "observe"]


def observe(socket: Optional[Any] = None) -> "Observer":
    """A read-only mapping of the arena of the agent on ``socket`` (default:
    ``$KVARENA_SOCKET``, else ``/run/kvarena/kvarena.sock``). Raises
    :class:`~kvarena.AgentNotFound` when no agent listens there."""
    path = None if socket is None else os.fsencode(socket)
    if path is not None and (not path or b"\0" in path):
        raise InvalidArgument(errno.EINVAL, "socket: an empty path or one with a NUL byte")
    a = c_void_p()
    info = A.kva_agent_info()
    ret = _lib.lib().kva_observe(path, byref(a), byref(info))
    if ret < 0:
        raise _lib.fail(ret, "kva_observe", attaching=True)
    return Observer._adopt(int(a.value), AgentInfo._from(info))


class Observer:
    """A read-only mapping of an agent's arena. Close it (or use ``with``)."""

    agent: AgentInfo
    info: ArenaInfo

    def __init__(self) -> None:
        raise TypeError("observers are made by kvarena.observe()")

    @classmethod
    def _adopt(cls, arena: int, agent: AgentInfo) -> "Observer":
        self = object.__new__(cls)
        self._a: Optional[int] = arena
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.agent = agent
        self.info = ArenaInfo._from(_lib.lib().kva_arena_info(arena).contents)
        return self

    def _call(self, what: str, fn: str, *args: Any, ok: tuple[int, ...] = ()) -> int:
        with self._lock:
            if self._a is None or self._pid != os.getpid():
                raise Closed(errno.EBADF, "the observer is closed", what)
            ret = getattr(_lib.lib(), fn)(self._a, *args)
            if ret < 0 and ret not in ok:
                raise _lib.fail(ret, fn)
        return ret

    def stats(self) -> Stats:
        """Allocator counts (``kvarena-ctl status``)."""
        st = A.kva_stats()
        self._call("stats", "kva_arena_stats", byref(st))
        return Stats._from(st)

    def prefix_stats(self) -> PrefixStats:
        """The prefix cache (``kvarena-ctl prefix``)."""
        st = A.kva_prefix_stats()
        self._call("prefix_stats", "kva_arena_prefix_stats", byref(st))
        return PrefixStats._from(st)

    def seq_stats(self, slot: int) -> SeqSlotStats:
        """One worker slot's sequences (``kvarena-ctl seqs``)."""
        st = A.kva_seq_slot_stats()
        slot = as_int("slot", slot, 0, self.info.max_workers - 1)
        self._call("seq_stats", "kva_arena_seq_stats", slot, byref(st))
        return SeqSlotStats._from(st)

    def tier_stats(self) -> TiersStats:
        """The tiers below the arena (``kvarena-ctl tiers``)."""
        st = A.kva_tiers_stats()
        self._call("tier_stats", "kva_arena_tier_stats", byref(st))
        return TiersStats._from(st)

    def check(self) -> CheckReport:
        """The global invariant (``kvarena-ctl check``); ``ok=False`` on a breach."""
        r = A.kva_check_report()
        ret = self._call("check", "kva_arena_check", byref(r), ok=(-errno.EUCLEAN,))
        return CheckReport._from(r, ret == 0)

    def map(self, cells: Optional[int] = None) -> str:
        """The block map (see :meth:`kvarena.Worker.map`)."""
        cells = self.info.blocks if cells is None else as_int("cells", cells, 1, U32 - 1)
        cells = min(cells, self.info.blocks)
        buf = ctypes.create_string_buffer(cells + 1)
        n = self._call("map", "kva_arena_map", buf, cells + 1, cells)
        return buf.raw[:n].decode("ascii", "replace")

    def agent_state(self) -> tuple[str, int]:
        """(``"none"`` / ``"running"`` / ``"stopping"``, the agent's pid) as
        the agent last announced them."""
        pid = c_int32()
        st = self._call("agent_state", "kva_arena_agent", byref(pid))
        return ({0: "none", 1: "running", 2: "stopping"}.get(st, str(st)), int(pid.value))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._a is None

    def close(self) -> None:
        """Unmap. Idempotent."""
        with self._lock:
            a, self._a = self._a, None
            if a is not None and self._pid == os.getpid():
                _lib.lib().kva_arena_close(a)

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "closed" if self._a is None else f"agent pid {self.agent.pid}"
        return f"<kvarena.Observer of arena {self.info.name!r}, {state}>"
