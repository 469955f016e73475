# SPDX-License-Identifier: MIT
"""ctypes mirrors of the public structs of ``kvarena.h`` (and the headers it
includes), field for field.

Every struct listed in :data:`CHECKED` is compared at load time with
``kva_sizeof()`` of the library actually loaded; a size that differs means a
header and a library of different versions, and the binding refuses to load
(``_lib.py``) rather than read or write past a struct.
"""
from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)

KVA_MAX_WORKERS = 48
KVA_MAX_BLOCKS = 0x7FFFFFFF
KVA_OWNER_KINDS = 3
KVA_MAX_TENANT_QUOTAS = 16
KVA_TIERS = 2
KVA_KV_SCALE_PER_TENSOR = 0x1

# enums are C ints on every ABI kvarena builds for
c_enum = c_int


class kva_geometry(Structure):
    _fields_ = [
        ("block_tokens", c_uint32),
        ("layers", c_uint32),
        ("kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("dtype", c_enum),
        ("layout", c_enum),
    ]


class kva_block_layout(Structure):
    _fields_ = [
        ("elem_bytes", c_uint32),
        ("page_bytes", c_uint64),
        ("page_stride", c_uint64),
        ("head_stride", c_uint64),
        ("token_stride", c_uint64),
        ("scale_bytes", c_uint64),
        ("scale_stride", c_uint64),
        ("block_bytes", c_uint64),
        ("block_stride", c_uint64),
        ("pool_bytes", c_uint64),
        ("data_bytes", c_uint64),
    ]


class kva_arena_info(Structure):
    _fields_ = [
        ("geometry", kva_geometry),
        ("layout", kva_block_layout),
        ("blocks", c_uint32),
        ("max_workers", c_uint32),
        ("cache_blocks", c_uint32),
        ("hugetlb", c_int),
        ("numa_node", c_int32),
        ("meta_bytes", c_uint64),
        ("alloc_meta_bytes", c_uint64),
        ("index_entries", c_uint64),
        ("tier_keys", c_uint64),
        ("name", c_char * 32),
        ("backend", c_enum),
        ("ipc", c_enum),
        ("device_name", c_char * 64),
        ("device_uuid", c_char * 48),
        ("device_total_bytes", c_uint64),
        ("granularity", c_uint64),
        ("chunk_bytes", c_uint64),
        ("chunks", c_uint32),
        ("data_map_bytes", c_uint64),
    ]


class kva_cuda_device(Structure):
    _fields_ = [
        ("ordinal", c_int),
        ("name", c_char * 64),
        ("uuid", c_char * 48),
        ("total_bytes", c_uint64),
        ("free_bytes", c_uint64),
        ("granularity", c_uint64),
        ("vmm", c_int),
        ("posix_fd", c_int),
        ("rdma", c_int),
    ]


class kva_agent_slot(Structure):
    _fields_ = [
        ("state", c_uint32),
        ("generation", c_uint32),
        ("pid", c_int32),
        ("uid", c_uint32),
        ("pending_ms", c_uint32),
    ]


class kva_agent_report(Structure):
    _fields_ = [
        ("repairs", c_uint64),
        ("last_repair", c_char * 128),
        ("reclaims_pending", c_uint32),
        ("max_workers", c_uint32),
        ("device_free_bytes", c_uint64),
        ("device_total_bytes", c_uint64),
        ("slots", kva_agent_slot * KVA_MAX_WORKERS),
    ]


class kva_slot_stats(Structure):
    _fields_ = [
        ("slot", c_uint32),
        ("state", c_uint32),
        ("generation", c_uint32),
        ("pid", c_int32),
        ("name", c_char * 32),
        ("owned", c_uint32),
        ("shared", c_uint32),
        ("cached", c_uint32),
        ("refills", c_uint64),
        ("flushes", c_uint64),
        ("shares", c_uint64),
    ]


class kva_stats(Structure):
    _fields_ = [
        ("total_blocks", c_uint32),
        ("free_blocks", c_uint32),
        ("used_blocks", c_uint32),
        ("owned_blocks", c_uint32),
        ("shared_blocks", c_uint32),
        ("shared_refs", c_uint32),
        ("cached_blocks", c_uint32),
        ("workers", c_uint32),
        ("max_workers", c_uint32),
        ("prefix_cached_blocks", c_uint32),
        ("slots", kva_slot_stats * KVA_MAX_WORKERS),
    ]


class kva_check_report(Structure):
    _fields_ = [
        ("free_blocks", c_uint32),
        ("owned_blocks", c_uint32),
        ("shared_blocks", c_uint32),
        ("shared_refs", c_uint32),
        ("bad_descriptors", c_uint32),
        ("stale_owners", c_uint32),
        ("dead_holders", c_uint32),
        ("hints_missing", c_uint32),
        ("dead_slots", c_uint32),
        ("first_bad_block", c_int64),
        ("cached_blocks", c_uint32),
        ("index_bad", c_uint32),
        ("published_blocks", c_uint32),
        ("published_count", c_uint64),
        ("published_bad", c_uint32),
        ("first_problem", c_char * 160),
    ]


class kva_attach_times(Structure):
    _fields_ = [
        ("connect_ns", c_uint64),
        ("welcome_ns", c_uint64),
        ("meta_ns", c_uint64),
        ("driver_ns", c_uint64),
        ("reserve_ns", c_uint64),
        ("recv_ns", c_uint64),
        ("import_ns", c_uint64),
        ("map_ns", c_uint64),
        ("access_ns", c_uint64),
        ("adopt_ns", c_uint64),
        ("total_ns", c_uint64),
        ("chunks", c_uint32),
        ("messages", c_uint32),
    ]


class kva_agent_info(Structure):
    _fields_ = [("pid", c_int32), ("arena", c_char * 32)]


# ------------------------------------------------------------ kvarena_seq.h


class kva_seq_opts(Structure):
    _fields_ = [
        ("kind", c_enum),
        ("model", ctypes.c_char_p),
        ("adapter", ctypes.c_char_p),
        ("tenant", c_uint32),
        ("run_id", c_uint64),
        ("reserve_tokens", c_size_t),
        ("max_tokens", c_size_t),
    ]


class kva_tenant_quota(Structure):
    _fields_ = [("tenant", c_uint32), ("blocks", c_uint32)]


class kva_quotas(Structure):
    _fields_ = [
        ("kind", c_uint32 * KVA_OWNER_KINDS),
        ("tenant", kva_tenant_quota * KVA_MAX_TENANT_QUOTAS),
    ]


class kva_prefix_stats(Structure):
    _fields_ = [
        ("policy", c_enum),
        ("index_entries", c_uint64),
        ("index_valid", c_uint64),
        ("index_tombstones", c_uint64),
        ("index_ghosts", c_uint64),
        ("cached_blocks", c_uint64),
        ("published_blocks", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("published", c_uint64),
        ("duplicates", c_uint64),
        ("evictions", c_uint64),
        ("stale_entries", c_uint64),
        ("index_full", c_uint64),
        ("published_now", c_uint64),
        ("cache_limit", c_uint64),
        ("open_seqs", c_uint64),
        ("kind_blocks", c_uint64 * KVA_OWNER_KINDS),
        ("quotas", kva_quotas),
        ("tenant_blocks", c_uint64 * KVA_MAX_TENANT_QUOTAS),
    ]


class kva_seq_slot_stats(Structure):
    _fields_ = [
        ("open_seqs", c_uint32),
        ("kind_blocks", c_uint64 * KVA_OWNER_KINDS),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("published", c_uint64),
        ("evictions", c_uint64),
    ]


# ---------------------------------------------------------- kvarena_tiers.h


class kva_match(Structure):
    _fields_ = [
        ("tokens", c_size_t),
        ("below_tokens", c_size_t),
        ("below_host_tokens", c_size_t),
        ("below_disk_tokens", c_size_t),
    ]


class kva_fetch_result(Structure):
    _fields_ = [
        ("tokens", c_size_t),
        ("fetched_tokens", c_size_t),
        ("host_blocks", c_uint32),
        ("disk_blocks", c_uint32),
        ("failed_blocks", c_uint32),
        ("orphan_blocks", c_uint32),
        ("ns", c_uint64),
    ]


class kva_tier_stats(Structure):
    _fields_ = [
        ("enabled", c_int),
        ("degraded", c_int),
        ("direct", c_int),
        ("hugetlb", c_int),
        ("preallocated", c_int),
        ("warming", c_int),
        ("numa_node", c_int32),
        ("queue_depth", c_uint32),
        ("capacity_records", c_uint64),
        ("used_records", c_uint64),
        ("record_bytes", c_uint64),
        ("hits", c_uint64),
        ("records_in", c_uint64),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("fetch_p50_ns", c_uint64),
        ("fetch_p99_ns", c_uint64),
        ("io_errors", c_uint64),
        ("verify_failed", c_uint64),
        ("stale", c_uint64),
        ("dropped", c_uint64),
        ("restart_found", c_uint64),
        ("restart_dropped", c_uint64),
        ("scan_done", c_uint64),
        ("scan_total", c_uint64),
        ("degraded_ms", c_uint64),
        ("reason", c_char * 96),
        ("path", c_char * 128),
    ]


class kva_tiers_stats(Structure):
    _fields_ = [
        ("tier", kva_tier_stats * KVA_TIERS),
        ("backed", c_uint64),
        ("back_skipped", c_uint64),
        ("unbacked_evictions", c_uint64),
        ("below_found", c_uint64),
        ("fetched", c_uint64),
        ("fetch_failed", c_uint64),
        ("fetch_requests", c_uint64),
        ("spilled_host", c_uint64),
        ("spilled_disk", c_uint64),
    ]


# -------------------------------------------------------- kvarena_kernels.h


class kva_page_table(Structure):
    _fields_ = [
        ("batch", c_int32),
        ("page_size", c_int32),
        ("indptr", POINTER(c_int32)),
        ("indices", POINTER(c_int32)),
        ("last_page_len", POINTER(c_int32)),
    ]


class kva_kv_desc(Structure):
    _fields_ = [
        ("k", c_void_p),
        ("v", c_void_p),
        ("page_stride", c_int64),
        ("token_stride", c_int64),
        ("head_stride", c_int64),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("dtype", c_enum),
        ("k_scale", POINTER(c_float)),
        ("v_scale", POINTER(c_float)),
        ("page_size", c_int32),
        ("num_pages", c_int32),
        ("flags", c_uint32),
        ("scale_page_stride", c_int64),
        ("scale_token_stride", c_int64),
        ("scale_head_stride", c_int64),
    ]


class kva_decode_opts(Structure):
    _fields_ = [
        ("threads", c_int32),
        ("split_tokens", c_int32),
        ("max_splits", c_int32),
        ("isa", c_enum),
        ("pf_step", c_int32),
    ]


# Every mirror above, by the name kva_sizeof() knows it under.
CHECKED: tuple[type[Structure], ...] = (
    kva_geometry,
    kva_block_layout,
    kva_arena_info,
    kva_cuda_device,
    kva_agent_report,
    kva_slot_stats,
    kva_stats,
    kva_check_report,
    kva_attach_times,
    kva_agent_info,
    kva_seq_opts,
    kva_quotas,
    kva_prefix_stats,
    kva_seq_slot_stats,
    kva_match,
    kva_fetch_result,
    kva_tier_stats,
    kva_tiers_stats,
    kva_page_table,
    kva_kv_desc,
    kva_decode_opts,
)
