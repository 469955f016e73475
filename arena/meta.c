/* SPDX-License-Identifier: MIT */
/*
 * meta.c - the metadata region's layout and its header's validation.
 *
 * The layout is a function of (blocks, max_workers, tier_keys) alone, so a process that
 * opens an arena recomputes every offset and compares: an offset read from
 * shared memory is never followed.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "arena_pvt.h"

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

void kva__meta_layout(uint32_t blocks, uint32_t max_workers, uint64_t tier_keys,
		      struct kva__meta_layout *m)
{
	uint64_t off = KVA__HEADER_BYTES;

	m->l0_words = (uint32_t)(((uint64_t)blocks + 63) / 64);
	m->l1_words = (m->l0_words + 63) / 64;
	m->pool_off = off;
	off += sizeof(struct kva__pool);
	m->slots_off = off;
	off += (uint64_t)max_workers * sizeof(struct kva__slot);
	m->desc_off = off = align_up(off, 64);
	off += (uint64_t)blocks * sizeof(uint64_t);
	m->l0_off = off = align_up(off, 64);
	off += (uint64_t)m->l0_words * sizeof(uint64_t);
	m->l1_off = off = align_up(off, 64);
	off += (uint64_t)m->l1_words * sizeof(uint64_t);
	/* the prefix index: at least four entries a block. Every block
	 * published and the eviction history the PREFIX policy keeps (the
	 * keys of the last 2 x blocks evictions, evict.c) fill three quarters
	 * at most. The keys of the records in the tiers below (spilled
	 * entries) take two entries each: half full at most */
	m->idx_entries = 64;
	while (m->idx_entries < 4ull * blocks + 2 * tier_keys)
		m->idx_entries <<= 1;
	m->idx_off = off = align_up(off, 64);
	off += m->idx_entries * sizeof(struct kva__pentry);
	m->bmeta_off = off = align_up(off, 64);
	off += (uint64_t)blocks * sizeof(struct kva__bmeta);
	m->dirty_off = off = align_up(off, 64);
	off += (uint64_t)m->l0_words * sizeof(uint64_t);
	m->dsum_off = off = align_up(off, 64);
	off += (uint64_t)m->l1_words * sizeof(uint64_t);
	m->fetch_off = off = align_up(off, 64);
	off += (uint64_t)max_workers * sizeof(struct kva__fetch_area);
	m->meta_bytes = align_up(off, 4096);
}

uint64_t kva__header_checksum(const struct kva__header *h)
{
	return XXH64(h, offsetof(struct kva__header, checksum), KVA__HDR_SEED);
}

#define BAD(...) kva__err(-EBADMSG, "arena header: " __VA_ARGS__)

static int device_validate(const struct kva__header *h);

/*
 * kva__header_validate - check a private copy of a header against itself and
 * the sizes of the two files (a GPU arena's data has no file: @data_size is
 * not looked at). Each failure names the field.
 */
int kva__header_validate(const struct kva__header *h, uint64_t meta_size, uint64_t data_size)
{
	struct kva_geometry g;
	struct kva_block_layout l;
	struct kva__meta_layout m;
	int ret;

	if (h->magic != KVA__MAGIC)
		return BAD("magic %#llx is not kvarena's: not an arena metadata region",
			   (unsigned long long)h->magic);
	if (h->abi_version != KVA__ABI_VERSION)
		return kva__err(-EPROTONOSUPPORT,
				"arena header: ABI version %u, this library speaks %u",
				h->abi_version, KVA__ABI_VERSION);
	if (h->header_bytes != sizeof(*h))
		return BAD("header_bytes %u, expected %zu", h->header_bytes, sizeof(*h));
	if (h->checksum != kva__header_checksum(h))
		return BAD("checksum mismatch: the header was changed after creation");

	g = (struct kva_geometry){
		.block_tokens = h->block_tokens, .layers = h->layers,
		.kv_heads = h->kv_heads, .head_dim = h->head_dim,
		.dtype = (enum kva_dtype)h->dtype, .layout = (enum kva_layout)h->layout,
	};
	ret = kva_geometry_layout(&g, h->blocks, &l);
	if (ret < 0) {
		char why[256];

		snprintf(why, sizeof(why), "%s", kva_errmsg());
		return BAD("%s", why);
	}
	if (h->max_workers < 1 || h->max_workers > KVA_MAX_WORKERS)
		return BAD("max_workers %u out of range 1..%u", h->max_workers, KVA_MAX_WORKERS);
	if (h->cache_blocks > KVA__CACHE_MAX)
		return BAD("cache_blocks %u above %u", h->cache_blocks, KVA__CACHE_MAX);
	if (h->flags & ~KVA__HDR_HUGETLB)
		return BAD("unknown flags %#x", h->flags);
	if (h->numa_node < -1)
		return BAD("numa_node %d", h->numa_node);
	if (h->block_bytes != l.block_bytes)
		return BAD("block_bytes %llu, the geometry gives %llu",
			   (unsigned long long)h->block_bytes, (unsigned long long)l.block_bytes);
	if (h->block_stride != l.block_stride)
		return BAD("block_stride %llu, the geometry gives %llu",
			   (unsigned long long)h->block_stride, (unsigned long long)l.block_stride);
	if (h->page_bytes != l.page_bytes)
		return BAD("page_bytes %llu, the geometry gives %llu",
			   (unsigned long long)h->page_bytes, (unsigned long long)l.page_bytes);
	if (h->data_bytes != l.data_bytes)
		return BAD("data_bytes %llu, the geometry gives %llu",
			   (unsigned long long)h->data_bytes, (unsigned long long)l.data_bytes);

	if (h->tier_keys > KVA__TIER_KEYS_MAX)
		return BAD("tier_keys %llu above %llu", (unsigned long long)h->tier_keys,
			   (unsigned long long)KVA__TIER_KEYS_MAX);
	if (h->reserved0)
		return BAD("reserved0 %u is not zero", h->reserved0);
	kva__meta_layout(h->blocks, h->max_workers, h->tier_keys, &m);
	if (h->meta_bytes != m.meta_bytes || h->pool_off != m.pool_off || h->slots_off != m.slots_off ||
	    h->desc_off != m.desc_off || h->l0_off != m.l0_off || h->l1_off != m.l1_off ||
	    h->l0_words != m.l0_words || h->l1_words != m.l1_words || h->idx_off != m.idx_off ||
	    h->idx_entries != m.idx_entries || h->bmeta_off != m.bmeta_off ||
	    h->dirty_off != m.dirty_off || h->dsum_off != m.dsum_off || h->fetch_off != m.fetch_off)
		return BAD("region offsets do not follow from %u blocks, %u workers and %llu "
			   "tier keys", h->blocks, h->max_workers,
			   (unsigned long long)h->tier_keys);
	if (memchr(h->name, '\0', sizeof(h->name)) == NULL)
		return BAD("name is not terminated");
	if (meta_size != h->meta_bytes)
		return BAD("metadata file is %llu bytes, the header says %llu",
			   (unsigned long long)meta_size, (unsigned long long)h->meta_bytes);
	if (h->reserved1)
		return BAD("reserved1 %u is not zero", h->reserved1);
	if (h->backend == KVA_BACKEND_CUDA)
		return device_validate(h);
	if (h->backend != KVA_BACKEND_HOST)
		return BAD("backend %u", h->backend);
	if (h->ipc || h->granularity || h->chunk_bytes || h->map_bytes || h->device_total ||
	    h->chunks || h->device_name[0] || memcmp(h->device_uuid, (uint8_t[16]){ 0 }, 16))
		return BAD("a host-memory arena with a GPU region's fields set");
	if (data_size < h->data_bytes)
		return BAD("data file is %llu bytes, the arena needs %llu",
			   (unsigned long long)data_size, (unsigned long long)h->data_bytes);
	return 0;
}

static bool pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/*
 * A GPU region: the chunks cover the data and no more than the last
 * granule past it, every size a multiple of the granularity (what
 * cuMemMap will be asked for); legacy IPC is one allocation of the data.
 */
static int device_validate(const struct kva__header *h)
{
	if (h->flags & KVA__HDR_HUGETLB || h->numa_node != -1)
		return BAD("a GPU arena with host memory's huge pages or NUMA node");
	if (memchr(h->device_name, '\0', sizeof(h->device_name)) == NULL)
		return BAD("device name is not terminated");
	if (h->granularity && (!pow2(h->granularity) || h->granularity < 4096))
		return BAD("granularity %llu is not a power of two of 4096 or more",
			   (unsigned long long)h->granularity);
	if (h->ipc == KVA_IPC_LEGACY) {
		if (h->chunks != 1 || h->chunk_bytes != h->data_bytes || h->map_bytes != h->data_bytes)
			return BAD("legacy IPC with %u chunks of %llu bytes mapping %llu, for %llu "
				   "bytes of data", h->chunks, (unsigned long long)h->chunk_bytes,
				   (unsigned long long)h->map_bytes,
				   (unsigned long long)h->data_bytes);
		return 0;
	}
	if (h->ipc != KVA_IPC_FD)
		return BAD("ipc %u", h->ipc);
	if (!h->granularity || h->chunk_bytes % h->granularity || h->map_bytes % h->granularity ||
	    !h->chunk_bytes)
		return BAD("chunks of %llu bytes mapping %llu, not multiples of the granularity "
			   "%llu", (unsigned long long)h->chunk_bytes,
			   (unsigned long long)h->map_bytes, (unsigned long long)h->granularity);
	if (h->map_bytes < h->data_bytes || h->map_bytes - h->data_bytes >= h->granularity)
		return BAD("a range of %llu bytes for %llu bytes of data",
			   (unsigned long long)h->map_bytes, (unsigned long long)h->data_bytes);
	if (h->chunks < 1 || h->chunks > KVA_MAX_CHUNKS ||
	    h->chunks != (h->map_bytes + h->chunk_bytes - 1) / h->chunk_bytes)
		return BAD("%u chunks of %llu bytes for a range of %llu", h->chunks,
			   (unsigned long long)h->chunk_bytes, (unsigned long long)h->map_bytes);
	return 0;
}
