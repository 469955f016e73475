# SPDX-License-Identifier: MIT
"""What the arena reports, as frozen dataclasses: geometry and layout, the
arena's info, allocator stats, prefix-cache stats, tiers, the invariant check.

Field names are the C structs' (``kvarena.h``, ``kvarena_seq.h``,
``kvarena_tiers.h``) and those of ``kvarena-ctl --json``; strings are
decoded, enums are Python enums or their names.
"""
from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Optional, TypeVar

from . import _abi as A
from .dtypes import Backend, DType, Layout

__all__ = [
    "Geometry",
    "BlockLayout",
    "ArenaInfo",
    "SlotStats",
    "Stats",
    "Quotas",
    "PrefixStats",
    "SeqSlotStats",
    "Match",
    "FetchResult",
    "CheckReport",
    "TierStats",
    "TiersStats",
    "AttachTimes",
    "AgentInfo",
    "CudaDevice",
]

OWNER_KINDS = ("inference", "training", "pinned")
SLOT_STATES = ("free", "joining", "live", "reclaiming")
POLICIES = {0: "prefix", 1: "clock", 2: "prefix"}
IPC = {0: "auto", 1: "fd", 2: "legacy"}

T = TypeVar("T")


def _text(raw: bytes) -> str:
    # names come from shared memory any worker may write: never fail on them
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _copy(cls: type[T], s: ctypes.Structure, **given: Any) -> T:
    """An instance of dataclass ``cls`` from struct ``s``: each field not in
    ``given`` is the struct's member of the same name (bytes decoded)."""
    kw = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in given:
            kw[f.name] = given[f.name]
            continue
        v = getattr(s, f.name)
        kw[f.name] = _text(v) if isinstance(v, bytes) else v
    return cls(**kw)


@dataclass(frozen=True)
class Geometry:
    """The shape of one block (``struct kva_geometry``)."""

    block_tokens: int
    layers: int
    kv_heads: int
    head_dim: int
    dtype: DType
    layout: Layout

    @classmethod
    def _from(cls, s: A.kva_geometry) -> "Geometry":
        return _copy(cls, s, dtype=DType(s.dtype), layout=Layout(s.layout))


@dataclass(frozen=True)
class BlockLayout:
    """Where things are, in bytes (``struct kva_block_layout``). Inside one
    layer's K (or V) page the order is [kv_head][token][head_dim]."""

    elem_bytes: int
    page_bytes: int
    page_stride: int
    head_stride: int
    token_stride: int
    scale_bytes: int
    scale_stride: int
    block_bytes: int
    block_stride: int
    pool_bytes: int
    data_bytes: int

    @classmethod
    def _from(cls, s: A.kva_block_layout) -> "BlockLayout":
        return _copy(cls, s)


@dataclass(frozen=True)
class ArenaInfo:
    """What an arena is, fixed for its life (``struct kva_arena_info``)."""

    name: str
    geometry: Geometry
    layout: BlockLayout
    blocks: int
    max_workers: int
    cache_blocks: int
    hugetlb: bool
    numa_node: Optional[int]
    meta_bytes: int
    alloc_meta_bytes: int
    index_entries: int
    tier_keys: int
    backend: Backend
    ipc: str
    device_name: str
    device_uuid: str
    device_total_bytes: int
    granularity: int
    chunk_bytes: int
    chunks: int
    data_map_bytes: int

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: every layer's K and V (and int8 scales)."""
        return self.layout.block_bytes

    @classmethod
    def _from(cls, s: A.kva_arena_info) -> "ArenaInfo":
        return _copy(cls, s, geometry=Geometry._from(s.geometry),
                     layout=BlockLayout._from(s.layout), hugetlb=bool(s.hugetlb),
                     numa_node=None if s.numa_node < 0 else s.numa_node,
                     backend=Backend(s.backend), ipc=IPC.get(s.ipc, str(s.ipc)))


@dataclass(frozen=True)
class SlotStats:
    """One worker slot (``struct kva_slot_stats``)."""

    slot: int
    state: str  #: free, joining, live, reclaiming
    generation: int
    pid: int
    name: str
    owned: int
    shared: int
    cached: int
    refills: int
    flushes: int
    shares: int

    @classmethod
    def _from(cls, s: A.kva_slot_stats) -> "SlotStats":
        state = SLOT_STATES[s.state] if s.state < len(SLOT_STATES) else str(s.state)
        return _copy(cls, s, state=state)


@dataclass(frozen=True)
class Stats:
    """Allocator counts from one pass over the descriptors (``struct
    kva_stats``); ``slots`` lists the slots in use only."""

    total_blocks: int
    free_blocks: int
    used_blocks: int
    owned_blocks: int
    shared_blocks: int
    shared_refs: int
    cached_blocks: int  #: idle in worker caches
    workers: int
    max_workers: int
    prefix_cached_blocks: int  #: published prefix blocks nobody holds (evictable)
    slots: tuple[SlotStats, ...] = field(repr=False)

    @classmethod
    def _from(cls, s: A.kva_stats) -> "Stats":
        slots = tuple(SlotStats._from(x) for x in s.slots[: s.max_workers] if x.state)
        return _copy(cls, s, slots=slots)


@dataclass(frozen=True)
class Quotas:
    """Quotas in blocks held by sequences (0 = no limit): per owner kind, and
    per tenant as (tenant, blocks, used)."""

    inference: int
    training: int
    pinned: int
    tenants: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class PrefixStats:
    """The prefix cache (``struct kva_prefix_stats``, ``kvarena-ctl prefix``)."""

    policy: str
    index_entries: int
    index_valid: int
    index_tombstones: int
    index_ghosts: int
    cached_blocks: int
    published_blocks: int
    hits: int
    misses: int
    published: int
    duplicates: int
    evictions: int
    stale_entries: int
    index_full: int
    published_now: int
    cache_limit: int
    open_seqs: int
    usage: dict[str, int]  #: blocks held by sequences, by owner kind
    quotas: Quotas

    @property
    def hit_ratio(self) -> float:
        """Full blocks matched / full blocks looked up (0 before any)."""
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @classmethod
    def _from(cls, s: A.kva_prefix_stats) -> "PrefixStats":
        q = s.quotas
        tenants = tuple((q.tenant[i].tenant, q.tenant[i].blocks, s.tenant_blocks[i])
                        for i in range(A.KVA_MAX_TENANT_QUOTAS) if q.tenant[i].blocks)
        return _copy(cls, s, policy=POLICIES.get(s.policy, str(s.policy)),
                     usage=dict(zip(OWNER_KINDS, s.kind_blocks)),
                     quotas=Quotas(*q.kind, tenants))


@dataclass(frozen=True)
class SeqSlotStats:
    """One worker's sequences (``struct kva_seq_slot_stats``, ``kvarena-ctl seqs``)."""

    open_seqs: int
    usage: dict[str, int]
    hits: int
    misses: int
    published: int
    evictions: int

    @classmethod
    def _from(cls, s: A.kva_seq_slot_stats) -> "SeqSlotStats":
        return _copy(cls, s, usage=dict(zip(OWNER_KINDS, s.kind_blocks)))


@dataclass(frozen=True)
class Match:
    """What :meth:`Seq.match_tiers` found (``struct kva_match``)."""

    tokens: int  #: matched in the arena and attached
    below_tokens: int  #: the tokens right after them whose blocks are in a tier below
    below_host_tokens: int
    below_disk_tokens: int

    @classmethod
    def _from(cls, s: A.kva_match) -> "Match":
        return _copy(cls, s)


@dataclass(frozen=True)
class FetchResult:
    """What a fetch brought (``struct kva_fetch_result``)."""

    tokens: int  #: the sequence's length now
    fetched_tokens: int
    host_blocks: int
    disk_blocks: int
    failed_blocks: int
    orphan_blocks: int
    ns: int

    @classmethod
    def _from(cls, s: A.kva_fetch_result) -> "FetchResult":
        return _copy(cls, s)


@dataclass(frozen=True)
class CheckReport:
    """``kva_arena_check``: the global invariant (``ok``) and its counts."""

    ok: bool
    free_blocks: int
    owned_blocks: int
    shared_blocks: int
    shared_refs: int
    bad_descriptors: int
    stale_owners: int
    dead_holders: int
    hints_missing: int
    dead_slots: int
    first_bad_block: Optional[int]
    cached_blocks: int
    index_bad: int
    published_blocks: int
    published_count: int
    published_bad: int
    first_problem: str

    @classmethod
    def _from(cls, s: A.kva_check_report, ok: bool) -> "CheckReport":
        return _copy(cls, s, ok=ok,
                     first_bad_block=None if s.first_bad_block < 0 else s.first_bad_block)


@dataclass(frozen=True)
class TierStats:
    """One tier below the arena (``struct kva_tier_stats``)."""

    enabled: bool
    degraded: bool
    direct: bool
    hugetlb: bool
    preallocated: bool
    warming: bool
    numa_node: int
    queue_depth: int
    capacity_records: int
    used_records: int
    record_bytes: int
    hits: int
    records_in: int
    bytes_in: int
    bytes_out: int
    fetch_p50_ns: int
    fetch_p99_ns: int
    io_errors: int
    verify_failed: int
    stale: int
    dropped: int
    restart_found: int
    restart_dropped: int
    scan_done: int
    scan_total: int
    degraded_ms: int
    reason: str
    path: str

    @classmethod
    def _from(cls, s: A.kva_tier_stats) -> "TierStats":
        flags = ("enabled", "degraded", "direct", "hugetlb", "preallocated", "warming")
        return _copy(cls, s, **{k: bool(getattr(s, k)) for k in flags})


@dataclass(frozen=True)
class TiersStats:
    """The tiers below the arena (``struct kva_tiers_stats``, ``kvarena-ctl tiers``)."""

    host: TierStats
    disk: TierStats
    backed: int
    back_skipped: int
    unbacked_evictions: int
    below_found: int
    fetched: int
    fetch_failed: int
    fetch_requests: int
    spilled_host: int
    spilled_disk: int

    @classmethod
    def _from(cls, s: A.kva_tiers_stats) -> "TiersStats":
        return _copy(cls, s, host=TierStats._from(s.tier[0]), disk=TierStats._from(s.tier[1]))


@dataclass(frozen=True)
class AttachTimes:
    """Where ``kva_attach`` spent its time, in ns (``struct kva_attach_times``)."""

    connect_ns: int
    welcome_ns: int
    meta_ns: int
    driver_ns: int
    reserve_ns: int
    recv_ns: int
    import_ns: int
    map_ns: int
    access_ns: int
    adopt_ns: int
    total_ns: int
    chunks: int
    messages: int

    @classmethod
    def _from(cls, s: A.kva_attach_times) -> "AttachTimes":
        return _copy(cls, s)


@dataclass(frozen=True)
class AgentInfo:
    """The agent an observer connected to (``struct kva_agent_info``)."""

    pid: int
    arena: str

    @classmethod
    def _from(cls, s: A.kva_agent_info) -> "AgentInfo":
        return _copy(cls, s)


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device (``struct kva_cuda_device``)."""

    ordinal: int
    name: str
    uuid: str
    total_bytes: int
    free_bytes: int
    granularity: int
    vmm: bool
    posix_fd: bool
    rdma: bool

    @classmethod
    def _from(cls, s: A.kva_cuda_device) -> "CudaDevice":
        return _copy(cls, s, vmm=bool(s.vmm), posix_fd=bool(s.posix_fd), rdma=bool(s.rdma))


def as_dict(obj: Any) -> dict[str, Any]:
    """A stats object as plain data (enums as their names), e.g. for JSON."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, (DType, Layout, Backend)):
            return v.name.lower()
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(obj)
