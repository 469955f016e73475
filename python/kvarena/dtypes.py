# SPDX-License-Identifier: MIT
"""The arena's element types, and what numpy sees of them.

numpy has no bfloat16 and no fp8, so their bytes are shown as unsigned
integers of the same width: a bf16 array is ``uint16`` (the top half of a
float32), an fp8 e4m3 array is ``uint8``. :func:`bf16_to_float32`,
:func:`float32_to_bf16` and :func:`fp8_e4m3_to_float32` convert, with the
library's rounding (nearest even).
"""
from __future__ import annotations

import enum
from typing import Union

import numpy as np

__all__ = [
    "DType",
    "Layout",
    "Backend",
    "bf16_to_float32",
    "float32_to_bf16",
    "fp8_e4m3_to_float32",
]


class DType(enum.IntEnum):
    """``enum kva_dtype``."""

    F32 = 1
    F16 = 2
    BF16 = 3
    FP8_E4M3 = 4
    INT8 = 5  #: with one float scale per token and head, stored in the block

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype its bytes are viewed as (bf16: uint16, fp8: uint8)."""
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _NUMPY[self].itemsize

    @property
    def label(self) -> str:
        """The library's name for it: ``f32``, ``f16``, ``bf16``, ``fp8_e4m3``, ``int8``."""
        return _LABELS[self]

    @classmethod
    def of(cls, value: "DTypeLike") -> "DType":
        """A DType from a DType, its number, the library's name (``"bf16"``)
        or a numpy dtype of a floating type (float32, float16)."""
        if isinstance(value, DType):
            return value
        if isinstance(value, bool):
            raise TypeError("a dtype, not a bool")
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"no kvarena dtype {value}") from None
        if isinstance(value, str):
            key = value.lower().replace("-", "_")
            if key in _BY_NAME:
                return _BY_NAME[key]
            raise ValueError(f"unknown dtype {value!r}: one of f32, f16, bf16, fp8_e4m3, int8")
        try:
            npd = np.dtype(value)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(f"not a dtype: {value!r}") from None
        if npd == np.float32:
            return cls.F32
        if npd == np.float16:
            return cls.F16
        raise ValueError(f"numpy dtype {npd} is ambiguous or unsupported: name the kvarena "
                         "dtype (\"bf16\" for bfloat16 bits in uint16)")


DTypeLike = Union[DType, int, str, np.dtype, type]

_NUMPY = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(np.uint16),
    DType.FP8_E4M3: np.dtype(np.uint8),
    DType.INT8: np.dtype(np.int8),
}
_LABELS = {
    DType.F32: "f32",
    DType.F16: "f16",
    DType.BF16: "bf16",
    DType.FP8_E4M3: "fp8_e4m3",
    DType.INT8: "int8",
}
_BY_NAME = {
    "f32": DType.F32, "float32": DType.F32, "fp32": DType.F32,
    "f16": DType.F16, "float16": DType.F16, "fp16": DType.F16, "half": DType.F16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "fp8_e4m3": DType.FP8_E4M3, "fp8": DType.FP8_E4M3, "float8_e4m3fn": DType.FP8_E4M3,
    "int8": DType.INT8, "i8": DType.INT8,
}


class Layout(enum.IntEnum):
    """``enum kva_layout``: where one block's pages lie."""

    BLOCK_MAJOR = 0  #: one block = one contiguous span, all layers
    LAYER_MAJOR = 1  #: per-layer pools of K pages, then V pages


class Backend(enum.IntEnum):
    """``enum kva_backend``: where the data region lives."""

    HOST = 0
    CUDA = 1


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) to float32 (exact)."""
    a = np.asarray(bits)
    if a.dtype != np.uint16:
        raise TypeError(f"bf16 bits are uint16, not {a.dtype}")
    return (a.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bits (uint16), rounding to nearest even; NaN stays
    a quiet NaN (the library's own conversion)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def _fp8_table() -> np.ndarray:
    t = np.empty(256, dtype=np.float32)
    for x in range(256):
        sign = -1.0 if x & 0x80 else 1.0
        e, m = (x >> 3) & 0xF, x & 0x7
        if (x & 0x7F) == 0x7F:
            t[x] = np.nan
        elif e == 0:
            t[x] = sign * m * 2.0 ** -9
        else:
            t[x] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


_FP8 = _fp8_table()


def fp8_e4m3_to_float32(bits: np.ndarray) -> np.ndarray:
    """fp8 e4m3 ("fn": no infinities, largest finite 448) bits (uint8) to float32."""
    a = np.asarray(bits)
    if a.dtype != np.uint8:
        raise TypeError(f"fp8 bits are uint8, not {a.dtype}")
    return _FP8[a]
