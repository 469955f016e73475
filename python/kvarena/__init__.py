# SPDX-License-Identifier: MIT
"""kvarena: a node-local KV-cache arena shared by serving processes.

The Python binding of libkvarena (ctypes; numpy for block views and the
kernels). A worker process attaches to the ``kvarena-agent`` of its GPU or
node, allocates KV blocks from the shared arena, shares prompt prefixes
with every other process through sequences, and runs paged decode attention
over the blocks in place::

    import numpy as np
    import kvarena

    with kvarena.attach("/run/kvarena/kvarena.sock", "engine-0") as w:
        with w.open_seq(model="llama-3-8b") as s:
            hit = s.match(prompt)                    # tokens another process computed
            s.reserve(len(prompt) - hit + 1)
            for layer in range(w.info.geometry.layers):
                w.store_kv(layer, k[layer], v[layer], s.slots(hit, len(prompt) - hit))
            s.append(prompt[hit:])                   # full blocks published for all
            out = w.decode(0, q, kvarena.PageTable.from_seqs([s]))

Errors are :class:`KvarenaError` (an ``OSError``: ``errno`` and the
library's sentence), with subclasses for what callers handle:
:class:`NoSpace`, :class:`QuotaExceeded`, :class:`AgentGone`,
:class:`ShuttingDown`, ... The library is found through ``$KVARENA_LIB``, a
build tree next to the package, or the system's library path.
"""
from __future__ import annotations

from . import _lib
from . import errors as _errors
from ._lib import library_path, load_library
from .dtypes import (
    Backend,
    DType,
    Layout,
    bf16_to_float32,
    float32_to_bf16,
    fp8_e4m3_to_float32,
)
from .errors import (
    AccessDenied,
    AgentGone,
    AgentNotFound,
    Busy,
    Closed,
    InvalidArgument,
    KvarenaError,
    LibraryError,
    NoData,
    NoSlots,
    NoSpace,
    NotPermitted,
    NotSupported,
    ProtocolError,
    QuotaExceeded,
    ShuttingDown,
    StaleWorker,
    TimedOut,
    TooLarge,
)
from .kernels import KVDesc, PageTable, decode, decode_tile, isa_best, kernel_threads, store_kv
from .observe import Observer, observe
from .seq import OwnerKind, Seq, prefix_hash, prefix_keys, prefix_salt
from .stats import (
    AgentInfo,
    ArenaInfo,
    AttachTimes,
    BlockLayout,
    CheckReport,
    CudaDevice,
    FetchResult,
    Geometry,
    Match,
    PrefixStats,
    Quotas,
    SeqSlotStats,
    SlotStats,
    Stats,
    TiersStats,
    TierStats,
    as_dict,
)
from .worker import Worker, attach, default_socket

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # attaching, workers, sequences
    "attach",
    "default_socket",
    "Worker",
    "Seq",
    "OwnerKind",
    "observe",
    "Observer",
    # kernels
    "PageTable",
    "KVDesc",
    "store_kv",
    "decode",
    "kernel_threads",
    "isa_best",
    "decode_tile",
    # dtypes
    "DType",
    "Layout",
    "Backend",
    "bf16_to_float32",
    "float32_to_bf16",
    "fp8_e4m3_to_float32",
    # keys
    "prefix_salt",
    "prefix_hash",
    "prefix_keys",
    # reports
    "ArenaInfo",
    "Geometry",
    "BlockLayout",
    "Stats",
    "SlotStats",
    "PrefixStats",
    "Quotas",
    "SeqSlotStats",
    "Match",
    "FetchResult",
    "CheckReport",
    "TiersStats",
    "TierStats",
    "AttachTimes",
    "AgentInfo",
    "CudaDevice",
    "as_dict",
    # errors: every one errors.py exports
    *_errors.__all__,
    # the library
    "load_library",
    "library_path",
    "cuda_available",
    "cuda_device",
    "tier_record_bytes",
]


def cuda_available() -> bool:
    """Whether the library's CUDA paths can run here (built with nvcc,
    libcuda.so.1 loads, a device exists)."""
    return _lib.lib().kva_cuda_available() == 0


def cuda_device(device: str = "0") -> CudaDevice:
    """A CUDA device's name, UUID, memory and capabilities
    (``kva_cuda_device_query``; an ordinal or a ``GPU-...`` UUID). Raises
    :class:`NotSupported` without a driver or device."""
    import ctypes

    from . import _abi
    from ._args import cstr

    d = _abi.kva_cuda_device()
    _lib.check(_lib.lib().kva_cuda_device_query(cstr("device", device), ctypes.byref(d)),
               "kva_cuda_device_query")
    return CudaDevice._from(d)


def tier_record_bytes(block_bytes: int) -> int:
    """Bytes one block takes in a spill tier (to size --host-bytes / --disk-bytes)."""
    from ._args import as_int

    return int(_lib.lib().kva_tier_record_bytes(as_int("block_bytes", block_bytes)))
