/* SPDX-License-Identifier: MIT */
/*
 * abi.c - the sizes of the public structs as this library was built with
 * them: bindings that lay the structs out themselves (Python's ctypes,
 * python/kvarena) check theirs against these before the first call, so
 * that a header and a library of different versions are refused rather
 * than read past.
 */
#include <stddef.h>
#include <string.h>

#include "kvarena.h"

#define S(name) { #name, sizeof(struct name) }

static const struct {
	const char *name;
	size_t size;
} sizes[] = {
	S(kva_agent_info), S(kva_agent_report), S(kva_arena_info), S(kva_arena_opts),
	S(kva_attach_times), S(kva_block_layout), S(kva_block_state), S(kva_check_report),
	S(kva_cuda_device), S(kva_cuda_opts), S(kva_decode_opts), S(kva_fetch_result),
	S(kva_geometry),
	S(kva_kv_desc), S(kva_match), S(kva_page_table), S(kva_prefix_stats), S(kva_quotas),
	S(kva_reclaim_report), S(kva_seq_opts), S(kva_seq_slot_stats), S(kva_slot_stats),
	S(kva_stats), S(kva_tier_stats), S(kva_tiers_stats), S(kva_worker_cache),
};

#undef S

size_t kva_sizeof(const char *type)
{
	if (!type)
		return 0;
	if (!strncmp(type, "struct ", 7))
		type += 7;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (!strcmp(sizes[i].name, type))
			return sizes[i].size;
	return 0;
}
