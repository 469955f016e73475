# SPDX-License-Identifier: MIT
"""Exceptions of the kvarena binding.

Every failure of a library call is a :class:`KvarenaError` (an
:class:`OSError`): ``e.errno`` is the errno the C function returned (as a
positive number), ``e.strerror`` the library's own sentence about it
(``kva_errmsg()``: which field, which slot, which size) or, when the library
said nothing, the errno's usual text, and ``e.function`` the C function (or
binding method) that failed.

The subclasses are the cases a caller handles differently::

    try:
        ids = w.alloc(64)
    except kvarena.NoSpace:
        evict_something()          # -ENOSPC: the arena is full
    except kvarena.QuotaExceeded:
        reject_request()           # -EDQUOT: an owner kind's or tenant's quota

Bad arguments found by the binding itself, before any C call, are
:class:`TypeError` (wrong type) or :class:`InvalidArgument` (a
:class:`ValueError` and a :class:`KvarenaError` with errno ``EINVAL``), the
same class the library's own ``-EINVAL`` gives.
"""
from __future__ import annotations

import errno as _errno
import os
from typing import Optional

__all__ = [
    "KvarenaError",
    "InvalidArgument",
    "NoSpace",
    "QuotaExceeded",
    "TooLarge",
    "NotPermitted",
    "StaleWorker",
    "Busy",
    "NoSlots",
    "AccessDenied",
    "AgentNotFound",
    "AgentGone",
    "ShuttingDown",
    "ProtocolError",
    "TimedOut",
    "NoData",
    "NotSupported",
    "Closed",
    "LibraryError",
]


class KvarenaError(OSError):
    """A kvarena call failed: ``errno``, the library's sentence in
    ``strerror``, and the failing call in ``function``."""

    function: str

    def __init__(self, err: int, message: str = "", function: str = "") -> None:
        if not message:
            message = os.strerror(err)
        super().__init__(err, message)
        self.function = function

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno or 0, str(self.errno))
        where = f"{self.function}: " if self.function else ""
        return f"{where}{self.strerror} [{name}]"

    def __reduce__(self):  # picklable across multiprocessing
        return (type(self), (self.errno, self.strerror, self.function))


class InvalidArgument(KvarenaError, ValueError):
    """-EINVAL, or a bad value the binding caught before calling the library."""


class NoSpace(KvarenaError):
    """-ENOSPC: fewer blocks free (or evictable) than asked for."""


class QuotaExceeded(KvarenaError):
    """-EDQUOT: an owner kind's or a tenant's quota (the agent's --quota-* and
    --tenant-quota), or, attaching, the agent's slots per process or user."""


class TooLarge(KvarenaError):
    """-EFBIG: past the sequence's max_tokens."""


class NotPermitted(KvarenaError):
    """-EPERM: a block this worker does not hold (double or foreign free), or
    another worker's exclusive block."""


class StaleWorker(KvarenaError):
    """-ESTALE: this worker's slot was reclaimed; it must not be used again."""


class Busy(KvarenaError):
    """-EBUSY: e.g. match on a sequence that is not empty, or a fetch after
    the sequence moved."""


class NoSlots(KvarenaError):
    """-EUSERS: every worker slot of the arena is taken."""


class AccessDenied(KvarenaError, PermissionError):
    """-EACCES: the socket's mode or the agent's uid/gid policy refused us."""


class AgentNotFound(KvarenaError, ConnectionRefusedError):
    """-ENOENT / -ECONNREFUSED attaching: no agent listens on that socket."""


class AgentGone(KvarenaError, ConnectionResetError):
    """-ECONNRESET: the agent died (the worker's memory keeps working), or
    -ENOTCONN: the call needs an agent this worker does not have."""


class ShuttingDown(KvarenaError):
    """-ESHUTDOWN: the agent is stopping; free what you hold and detach."""


class ProtocolError(KvarenaError):
    """-EPROTO / -EPROTONOSUPPORT: a malformed answer, or another version."""


class TimedOut(KvarenaError, TimeoutError):
    """-ETIMEDOUT."""


class NoData(KvarenaError):
    """-ENODATA: nothing to fetch from the tiers below."""


class NotSupported(KvarenaError):
    """-ENOTSUP / -EMEDIUMTYPE / -ENODEV: not possible here, e.g. numpy views
    of a GPU arena, or CUDA without a driver."""


class Closed(KvarenaError, ValueError):
    """A call on a worker after detach, or on a sequence after close (EBADF).
    Never reaches the library."""


class LibraryError(ImportError):
    """libkvarena.so could not be found or loaded, or its structs are laid
    out differently from this binding's (a library of another version)."""


_BY_ERRNO: dict[int, type[KvarenaError]] = {
    _errno.EINVAL: InvalidArgument,
    _errno.ENOSPC: NoSpace,
    _errno.EDQUOT: QuotaExceeded,
    _errno.EFBIG: TooLarge,
    _errno.EPERM: NotPermitted,
    _errno.ESTALE: StaleWorker,
    _errno.EBUSY: Busy,
    _errno.EUSERS: NoSlots,
    _errno.EACCES: AccessDenied,
    _errno.ECONNREFUSED: AgentNotFound,
    _errno.ECONNRESET: AgentGone,
    _errno.ENOTCONN: AgentGone,
    _errno.ESHUTDOWN: ShuttingDown,
    _errno.EPROTO: ProtocolError,
    _errno.EPROTONOSUPPORT: ProtocolError,
    _errno.ETIMEDOUT: TimedOut,
    _errno.ENODATA: NoData,
    _errno.ENOTSUP: NotSupported,
    _errno.EMEDIUMTYPE: NotSupported,
    _errno.ENODEV: NotSupported,
    _errno.EBADF: Closed,
}


def error_for(err: int, message: str = "", function: str = "",
              attaching: bool = False) -> KvarenaError:
    """The exception for errno ``err`` (positive) of ``function``.

    ``attaching``: -ENOENT means "no agent at that socket" (AgentNotFound)
    rather than a missing thing in general.
    """
    cls: Optional[type[KvarenaError]]
    if attaching and err == _errno.ENOENT:
        cls = AgentNotFound
    else:
        cls = _BY_ERRNO.get(err, KvarenaError)
    return cls(err, message, function)
