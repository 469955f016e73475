# SPDX-License-Identifier: MIT
"""Argument checks shared by the binding: every value that reaches a C call
is of the C type's range, and every buffer is of the size the C function
will read or write. Wrong types are TypeError; wrong values InvalidArgument.
"""
from __future__ import annotations

import ctypes
import operator
from typing import Any, Iterable, Optional, Union

import numpy as np

from .errors import InvalidArgument

U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF
I32 = 0x7FFFFFFF
SIZE_MAX = U64

IntArrayLike = Union[Iterable[int], np.ndarray]


def as_int(name: str, value: Any, lo: int = 0, hi: int = U64) -> int:
    """``value`` as an int in ``lo..hi``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if v < lo or v > hi:
        raise InvalidArgument(22, f"{name} {v} is out of range {lo}..{hi}")
    return v


def cstr(name: str, value: Optional[str], max_bytes: Optional[int] = None) -> Optional[bytes]:
    """``value`` as NUL-free UTF-8 bytes (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, str):
        raw = value.encode("utf-8")
    else:
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if b"\0" in raw:
        raise InvalidArgument(22, f"{name} contains a NUL byte")
    if max_bytes is not None and len(raw) > max_bytes:
        raise InvalidArgument(22, f"{name} is {len(raw)} bytes, at most {max_bytes}")
    return raw


def _int_array(name: str, values: Any) -> np.ndarray:
    """A 1-D integer numpy array of ``values`` (a sequence, an iterable or an
    array of integers; one integer is an array of one)."""
    if isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, (int, np.integer)) and not isinstance(values, (bool, np.bool_)):
        arr = np.array([int(values)], dtype=np.int64)
    elif isinstance(values, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be integers, not {type(values).__name__}")
    else:
        try:
            seq = list(values)
        except TypeError:
            raise TypeError(f"{name} must be an iterable of integers, not "
                            f"{type(values).__name__}") from None
        for x in seq:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{name} must be integers, found {type(x).__name__}")
        if seq and (min(seq) < -(1 << 63) or max(seq) >= (1 << 64)):
            raise InvalidArgument(22, f"{name}: a value is out of range")
        arr = np.array(seq, dtype=np.uint64 if seq and min(seq) >= 0 and max(seq) >= (1 << 63)
                       else np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, not {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidArgument(22, f"{name} must be one-dimensional, not of shape {arr.shape}")
    return arr


def _check_range(name: str, arr: np.ndarray, lo: int, hi: int, what: str) -> None:
    if arr.size == 0:
        return
    mn, mx = int(arr.min()), int(arr.max())
    if mn < lo or mx > hi:
        bad = mn if mn < lo else mx
        raise InvalidArgument(22, f"{name}: {what} {bad} is out of range {lo}..{hi}")


def as_ids(values: Any, blocks: int, name: str = "ids") -> Any:
    """Block ids as a contiguous uint32 buffer with ``.size`` and
    ``.ctypes.data`` (a numpy array), or, for a short list of ints (the
    common case, without numpy's overhead), a ctypes array; each id in
    0..blocks-1."""
    if type(values) is list and len(values) <= 4096 and \
            all(type(x) is int for x in values):
        if values and (min(values) < 0 or max(values) >= blocks):
            bad = min(values) if min(values) < 0 else max(values)
            raise InvalidArgument(22, f"{name}: block id {bad} is out of range 0..{blocks - 1}")
        return _U32Buf(values)
    arr = _int_array(name, values)
    _check_range(name, arr, 0, blocks - 1, "block id")
    return np.ascontiguousarray(arr, dtype=np.uint32)


class _U32Buf:
    """A ctypes uint32 array that answers ``.size`` and ``.ctypes.data`` as
    a numpy array does."""

    __slots__ = ("buf", "size", "ctypes")

    def __init__(self, values: list[int]) -> None:
        self.buf = (ctypes.c_uint32 * len(values))(*values)
        self.size = len(values)
        self.ctypes = self  # .ctypes.data

    @property
    def data(self) -> int:
        return ctypes.addressof(self.buf)


def as_tokens(values: Any, name: str = "tokens") -> np.ndarray:
    """Token ids as a contiguous int32 array, each in int32's range."""
    arr = _int_array(name, values)
    _check_range(name, arr, -(1 << 31), I32, "token id")
    return np.ascontiguousarray(arr, dtype=np.int32)


def as_i32_array(name: str, values: Any, lo: int = -(1 << 31), hi: int = I32,
                 ndim: int = 1) -> np.ndarray:
    """An int32 C-contiguous array of ``ndim`` dimensions, values in lo..hi
    (an int32 array that already is one is used as it is: no copy)."""
    if isinstance(values, np.ndarray) and ndim != 1:
        arr = values
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, not {arr.dtype}")
        if arr.ndim != ndim:
            raise InvalidArgument(22, f"{name} must have {ndim} dimensions, not shape {arr.shape}")
    elif ndim != 1:
        try:
            arr = np.asarray(values)
        except (ValueError, TypeError):
            raise TypeError(f"{name} must be a {ndim}-D array of integers") from None
        if arr.dtype.kind not in "iu" or arr.ndim != ndim:
            raise TypeError(f"{name} must be a {ndim}-D array of integers, not "
                            f"{arr.dtype} of shape {arr.shape}")
    else:
        arr = _int_array(name, values)
    _check_range(name, arr, lo, hi, "value")
    return np.ascontiguousarray(arr, dtype=np.int32)


def buffer_bytes(name: str, data: Any) -> np.ndarray:
    """A C-contiguous uint8 view of any buffer (bytes, bytearray, memoryview,
    numpy array), without a copy."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise InvalidArgument(22, f"{name} must be C-contiguous")
        return data.reshape(-1).view(np.uint8) if data.size else np.empty(0, np.uint8)
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{name} must be a bytes-like object, not "
                        f"{type(data).__name__}") from None
    if not mv.c_contiguous:
        raise InvalidArgument(22, f"{name} must be C-contiguous")
    if mv.nbytes == 0:
        return np.empty(0, np.uint8)
    return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv,
                         dtype=np.uint8)
