# SPDX-License-Identifier: MIT
"""Finding and loading libkvarena.so, and the prototype of every function the
binding calls (so that ctypes never guesses an argument or return type).

Where the library comes from, first match wins:

1. ``$KVARENA_LIB``: a path to ``libkvarena.so`` (nothing else is tried when
   it is set, so a typo is an error rather than another library);
2. a build tree next to the package: ``<repo>/build/release/libkvarena.so``,
   for a checkout (``python/kvarena`` beside ``build/``);
3. ``ctypes.util.find_library("kvarena")``: an installed library.

Loading checks every struct the binding mirrors against ``kva_sizeof()`` of
that library and refuses a library whose layout differs.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    POINTER,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Optional

from . import _abi as A
from .errors import KvarenaError, LibraryError, error_for

__all__ = ["lib", "load_library", "library_path", "errmsg", "check", "fail"]

_P = POINTER
_vp = c_void_p
_e = A.c_enum

# name: (restype, argtypes). Buffers (ids, tokens, numpy data) are c_void_p and
# passed as integer addresses; structs by reference.
_PROTOS: dict[str, tuple[object, list[object]]] = {
    # misc, geometry
    "kva_errmsg": (c_char_p, []),
    "kva_sizeof": (c_size_t, [c_char_p]),
    "kva_default_socket": (c_char_p, []),
    "kva_dtype_size": (c_size_t, [_e]),
    "kva_dtype_name": (c_char_p, [_e]),
    "kva_kv_offset": (c_uint64, [_P(A.kva_geometry), _P(A.kva_block_layout), c_uint32,
                                 c_uint32, c_uint32, c_int, c_int]),
    "kva_evict_policy_name": (c_char_p, [_e]),
    "kva_tier_record_bytes": (c_uint64, [c_uint64]),
    # agent, workers
    "kva_attach": (c_int, [c_char_p, c_char_p, _P(_vp)]),
    "kva_detach": (None, [_vp]),
    "kva_observe": (c_int, [c_char_p, _P(_vp), _P(A.kva_agent_info)]),
    "kva_worker_fd": (c_int, [_vp]),
    "kva_worker_poll": (c_int, [_vp]),
    "kva_worker_slot": (c_int, [_vp]),
    "kva_worker_arena": (_vp, [_vp]),
    "kva_worker_set_cache": (c_int, [_vp, c_uint32]),
    "kva_worker_attach_times": (c_int, [_vp, _P(A.kva_attach_times)]),
    # blocks
    "kva_alloc": (c_int, [_vp, c_uint32, _vp]),
    "kva_free": (c_int, [_vp, _vp, c_uint32]),
    "kva_share": (c_int, [_vp, _vp, c_uint32]),
    "kva_block_data": (_vp, [_vp, c_uint32]),
    "kva_block_kv": (c_int, [_vp, c_uint32, c_uint32, _P(_vp), _P(_vp)]),
    "kva_block_read": (c_int, [_vp, c_uint32, c_uint64, _vp, c_size_t]),
    "kva_block_write": (c_int, [_vp, c_uint32, c_uint64, _vp, c_size_t]),
    # arena: info, stats, check
    "kva_arena_info": (_P(A.kva_arena_info), [_vp]),
    "kva_arena_data_fd": (c_int, [_vp]),
    "kva_arena_close": (None, [_vp]),
    "kva_stats": (c_int, [_vp, _P(A.kva_stats)]),
    "kva_arena_stats": (c_int, [_vp, _P(A.kva_stats)]),
    "kva_arena_check": (c_int, [_vp, _P(A.kva_check_report)]),
    "kva_arena_map": (c_int, [_vp, _vp, c_size_t, c_uint32]),
    "kva_arena_agent_report": (c_int, [_vp, _P(A.kva_agent_report)]),
    "kva_arena_agent": (_e, [_vp, _P(c_int32)]),
    "kva_arena_prefix_stats": (c_int, [_vp, _P(A.kva_prefix_stats)]),
    "kva_arena_seq_stats": (c_int, [_vp, c_uint32, _P(A.kva_seq_slot_stats)]),
    "kva_arena_tier_stats": (c_int, [_vp, _P(A.kva_tiers_stats)]),
    # sequences
    "kva_seq_open": (c_int, [_vp, _P(A.kva_seq_opts), _P(_vp)]),
    "kva_seq_match": (c_int, [_vp, _vp, c_size_t, _P(c_size_t)]),
    "kva_seq_match_tiers": (c_int, [_vp, _vp, c_size_t, _P(A.kva_match)]),
    "kva_seq_reserve": (c_int, [_vp, c_size_t]),
    "kva_seq_append": (c_int, [_vp, _vp, c_size_t]),
    "kva_seq_fork": (c_int, [_vp, _P(_vp)]),
    "kva_seq_block_table": (c_int, [_vp, _P(_P(c_uint32)), _P(c_size_t), _P(c_size_t)]),
    "kva_seq_close": (None, [_vp]),
    "kva_seq_fetch_start": (c_int, [_vp, c_size_t]),
    "kva_seq_fetch_poll": (c_int, [_vp, _P(A.kva_fetch_result)]),
    "kva_seq_fetch_wait": (c_int, [_vp, c_int, _P(A.kva_fetch_result)]),
    "kva_seq_fetch_cancel": (c_int, [_vp, _P(A.kva_fetch_result)]),
    "kva_prefix_salt": (None, [c_char_p, c_char_p, c_uint32, _P(c_uint64)]),
    "kva_prefix_hash": (None, [_P(c_uint64), _P(c_uint64), _vp, c_size_t, _P(c_uint64)]),
    # kernels
    "kva_decode": (c_int, [_P(A.kva_kv_desc), _P(A.kva_page_table), _vp, _e, c_int32,
                           c_float, _vp, _vp, _P(A.kva_decode_opts)]),
    "kva_store_kv": (c_int, [_P(A.kva_kv_desc), _vp, _vp, _e, _vp, c_int32]),
    "kva_page_table_from_block_table": (c_int, [_vp, c_int64, _vp, c_int32, c_int32, _vp,
                                                _vp, _vp]),
    "kva_kv_desc_for_arena": (c_int, [_vp, c_uint32, _P(A.kva_kv_desc)]),
    "kva_kernel_threads": (c_int, []),
    "kva_isa_best": (_e, []),
    "kva_isa_name": (c_char_p, [_e]),
    "kva_decode_tile": (c_char_p, [_e, c_int32, c_int32]),
    "kva_cuda_available": (c_int, []),
    "kva_cuda_device_query": (c_int, [c_char_p, _P(A.kva_cuda_device)]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _candidates() -> list[str]:
    env = os.environ.get("KVARENA_LIB")
    if env:
        return [env]
    found = []
    root = Path(__file__).resolve().parent.parent.parent
    for sub in ("build/release", "build"):
        p = root / sub / "libkvarena.so"
        if p.exists():
            found.append(str(p))
    name = ctypes.util.find_library("kvarena")
    if name:
        found.append(name)
    return found


def _asan_unloaded(path: str) -> bool:
    """Whether ``path`` needs the AddressSanitizer runtime and this process
    does not have it (loading it would abort the interpreter, not raise)."""
    try:
        with open(path, "rb") as f:
            needs = b"libasan.so" in f.read()
        if not needs:
            return False
        with open("/proc/self/maps", "r", encoding="utf-8", errors="replace") as f:
            return "libasan.so" not in f.read()
    except OSError:
        return False


def _declare(cdll: ctypes.CDLL, path: str) -> None:
    missing = []
    for name, (restype, argtypes) in _PROTOS.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    if missing:
        raise LibraryError(f"{path} lacks {', '.join(missing)}: a libkvarena of another "
                           "version (this binding is for 0.1)")
    wrong = []
    for struct in A.CHECKED:
        theirs = cdll.kva_sizeof(struct.__name__.encode())
        ours = ctypes.sizeof(struct)
        if theirs != ours:
            wrong.append(f"struct {struct.__name__}: {theirs} bytes in the library, "
                         f"{ours} in the binding")
    if wrong:
        raise LibraryError(f"{path} lays its structs out differently from this binding "
                           f"(another version?): {'; '.join(wrong)}")


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Load libkvarena (from ``path``, else as the module docstring says),
    declare every function and check the struct layouts. Idempotent: the
    first library loaded stays; asking for another path afterwards raises.

    Raises :class:`LibraryError` when no library is found, it cannot be
    loaded, or its layout differs from the binding's.
    """
    global _lib, _path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.realpath(path) != os.path.realpath(_path or ""):
                raise LibraryError(f"libkvarena is already loaded from {_path}; "
                                   f"cannot load {path} as well")
            return _lib
        tried = [path] if path else _candidates()
        if not tried:
            raise LibraryError("libkvarena.so not found: set KVARENA_LIB to its path, "
                               "or install the library")
        errors = []
        for cand in tried:
            if os.path.sep in cand and not os.path.exists(cand):
                errors.append(f"{cand}: no such file")
                continue
            if os.path.sep in cand and _asan_unloaded(cand):
                errors.append(
                    f"{cand} is built with AddressSanitizer and this Python process "
                    "does not have its runtime: run with LD_PRELOAD=$(gcc "
                    "-print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0")
                continue
            try:
                cdll = ctypes.CDLL(cand)
            except OSError as e:
                errors.append(f"{cand}: {e}")
                continue
            _declare(cdll, cand)
            _lib, _path = cdll, cand
            return cdll
        raise LibraryError("could not load libkvarena: " + "; ".join(errors))


def lib() -> ctypes.CDLL:
    """The loaded library (loading it on first use)."""
    return _lib if _lib is not None else load_library()


def library_path() -> str:
    """The path (or name) libkvarena was loaded from."""
    lib()
    assert _path is not None
    return _path


def errmsg() -> str:
    """``kva_errmsg()``: the last failure of the calling thread, as a sentence."""
    raw = lib().kva_errmsg()
    return raw.decode("utf-8", "replace") if raw else ""


def fail(ret: int, function: str, attaching: bool = False) -> KvarenaError:
    """The exception for a negative return ``ret`` of ``function``, with the
    library's sentence (read right away, in the thread that called)."""
    return error_for(-ret, errmsg(), function, attaching)


def check(ret: int, function: str) -> int:
    """``ret`` if it is not negative, else raise :func:`fail`'s exception."""
    if ret < 0:
        raise fail(ret, function)
    return ret
