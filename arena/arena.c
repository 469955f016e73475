/* SPDX-License-Identifier: MIT */
/*
 * arena.c - make an arena, open one from its two fds, close it. A GPU
 * arena's data is device memory (devmem.c): its creator makes it here, and
 * a worker imports it through the agent (ipc/attach.c) after opening the
 * metadata alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena_pvt.h"
#include "devmem_pvt.h"

static uint32_t default_cache(uint32_t blocks)
{
	/* Cached blocks are invisible to other workers, but only while the
	 * arena has plenty: once a refill comes back short, caches stop
	 * refilling and flush whole (pool pressure). 1/64 of the arena, at
	 * most 256 (DPDK's usual size), none below 8 blocks. */
	uint32_t c = blocks / 64;

	if (c > 256)
		c = 256;
	return c < 8 ? 0 : c;
}

static int opts_check(const struct kva_arena_opts *o, uint32_t *workers, uint32_t *cache)
{
	*workers = o->max_workers ? o->max_workers : KVA_MAX_WORKERS;
	if (*workers > KVA_MAX_WORKERS)
		return kva__err(-EINVAL, "options: max_workers %u above %u", o->max_workers,
				KVA_MAX_WORKERS);
	if (o->cache_blocks == KVA_CACHE_NONE)
		*cache = 0;
	else if (o->cache_blocks == 0)
		*cache = default_cache(o->blocks);
	else if (o->cache_blocks > KVA__CACHE_MAX)
		return kva__err(-EINVAL, "options: cache_blocks %u above %u", o->cache_blocks,
				KVA__CACHE_MAX);
	else
		*cache = o->cache_blocks;
	if (o->flags & ~KVA_ARENA_HUGETLB)
		return kva__err(-EINVAL, "options: unknown flags %#x", o->flags);
	if (o->numa_node < -1)
		return kva__err(-EINVAL, "options: numa_node %d", o->numa_node);
	if (o->cuda && (o->flags & KVA_ARENA_HUGETLB || o->numa_node >= 0))
		return kva__err(-EINVAL, "options: huge pages and a NUMA node are for host memory, "
				"not a GPU arena");
	if (o->tier_keys > KVA__TIER_KEYS_MAX)
		return kva__err(-EINVAL, "options: tier_keys %llu above %llu",
				(unsigned long long)o->tier_keys,
				(unsigned long long)KVA__TIER_KEYS_MAX);
	return 0;
}

/*
 * Initial contents of a fresh metadata region: every block free and findable,
 * every slot's reclaim lease a robust process-shared mutex (recover.c).
 */
static int meta_init(uint8_t *meta, const struct kva__header *h)
{
	_Atomic uint64_t *l0 = (_Atomic uint64_t *)(meta + h->l0_off);
	_Atomic uint64_t *l1 = (_Atomic uint64_t *)(meta + h->l1_off);
	struct kva__slot *slots = (struct kva__slot *)(meta + h->slots_off);
	pthread_mutexattr_t ma;
	int ret;

	if ((ret = pthread_mutexattr_init(&ma)) ||
	    (ret = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED)) ||
	    (ret = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST)))
		return -ret;
	for (uint32_t i = 0; i < h->max_workers && !ret; i++)
		ret = pthread_mutex_init(&slots[i].reclaim, &ma);
	pthread_mutexattr_destroy(&ma);
	if (ret)
		return -ret;
	/* slots (FREE, generation 0) and descriptors (FREE, epoch 0) are all-zero
	 * words, which a fresh memfd already is */
	for (uint64_t w = 0; w < h->l0_words; w++) {
		uint64_t left = h->blocks - w * 64;

		atomic_init(&l0[w], left >= 64 ? ~0ull : (1ull << left) - 1);
		atomic_init(&l1[w / 64], atomic_load_explicit(&l1[w / 64], memory_order_relaxed) |
						 1ull << (w % 64));
	}
	memcpy(meta, h, sizeof(*h));
	return 0;
}

/* a host arena's data: a memfd, on huge pages if asked and there are some,
 * bound to a NUMA node if asked (before any page is touched) */
static int host_data(struct kva__header *h, const struct kva_block_layout *l,
		     const struct kva_arena_opts *o, int *fd)
{
	bool huge = o->flags & KVA_ARENA_HUGETLB;
	uint64_t data_size;
	void *data;
	int ret;

	ret = kva__region_create("kvarena-data", l->data_bytes, huge, fd, &data_size);
	if (ret < 0 && huge) {
		/* asked for huge pages but the system has none to give: ordinary pages */
		huge = false;
		ret = kva__region_create("kvarena-data", l->data_bytes, false, fd, &data_size);
	}
	if (ret == -EFBIG)
		return ret; /* kva_errmsg() says which limit */
	if (ret < 0)
		return kva__err(ret, "data memfd of %llu bytes: %s",
				(unsigned long long)l->data_bytes, strerror(-ret));
	h->flags = huge ? KVA__HDR_HUGETLB : 0;
	if (o->numa_node < 0)
		return 0;
	if ((ret = kva__region_map(*fd, data_size, false, &data)) < 0)
		return kva__err(ret, "mapping the data region: %s", strerror(-ret));
	ret = kva__region_bind_node(data, data_size, o->numa_node);
	munmap(data, data_size);
	if (ret < 0)
		return kva__err(ret, "binding the data region to NUMA node %d: %s", o->numa_node,
				ret == -EINVAL ? "no such node" : strerror(-ret));
	return 0;
}

int kva_arena_create(const struct kva_geometry *g, const struct kva_arena_opts *o,
		     struct kva_arena **out)
{
	struct kva_block_layout l;
	struct kva__meta_layout m;
	struct kva__header h;
	uint32_t workers = 0, cache = 0;
	uint64_t meta_size;
	int meta_fd = -1, data_fd = -1, ret;
	struct kva__dev *dev = NULL;
	void *meta = NULL;

	if (!g || !o || !out)
		return kva__err(-EINVAL, "kva_arena_create: NULL argument");
	kva__err_clear();
	if ((ret = kva_geometry_layout(g, o->blocks, &l)) < 0 ||
	    (ret = opts_check(o, &workers, &cache)) < 0)
		return ret;
	kva__meta_layout(o->blocks, workers, o->tier_keys, &m);

	memset(&h, 0, sizeof(h));
	h.magic = KVA__MAGIC;
	h.abi_version = KVA__ABI_VERSION;
	h.header_bytes = sizeof(h);
	h.block_tokens = g->block_tokens;
	h.layers = g->layers;
	h.kv_heads = g->kv_heads;
	h.head_dim = g->head_dim;
	h.dtype = g->dtype;
	h.layout = g->layout;
	h.blocks = o->blocks;
	h.max_workers = workers;
	h.cache_blocks = cache;
	h.numa_node = o->numa_node;
	h.block_bytes = l.block_bytes;
	h.block_stride = l.block_stride;
	h.page_bytes = l.page_bytes;
	h.data_bytes = l.data_bytes;
	h.meta_bytes = m.meta_bytes;
	h.pool_off = m.pool_off;
	h.slots_off = m.slots_off;
	h.desc_off = m.desc_off;
	h.l0_off = m.l0_off;
	h.l1_off = m.l1_off;
	h.l0_words = m.l0_words;
	h.l1_words = m.l1_words;
	h.idx_off = m.idx_off;
	h.idx_entries = m.idx_entries;
	h.bmeta_off = m.bmeta_off;
	h.tier_keys = o->tier_keys;
	h.dirty_off = m.dirty_off;
	h.dsum_off = m.dsum_off;
	h.fetch_off = m.fetch_off;
	snprintf(h.name, sizeof(h.name), "%s", o->name ? o->name : "kvarena");

	if (o->cuda) {
		struct kva__dev_geom dg;

		if ((ret = kva__dev_create(o->cuda, l.data_bytes, &dg, &dev)) < 0)
			return ret;
		h.backend = KVA_BACKEND_CUDA;
		h.ipc = dg.ipc;
		h.granularity = dg.granularity;
		h.chunk_bytes = dg.chunk_bytes;
		h.map_bytes = dg.map_bytes;
		h.chunks = dg.chunks;
		h.device_total = dg.total_bytes;
		memcpy(h.device_uuid, dg.uuid, sizeof(h.device_uuid));
		memcpy(h.device_name, dg.name, sizeof(h.device_name));
		h.device_name[sizeof(h.device_name) - 1] = '\0';
	}
	ret = kva__region_create("kvarena-meta", m.meta_bytes, false, &meta_fd, &meta_size);
	if (ret == -EFBIG)
		goto fail; /* kva_errmsg() says which limit */
	if (ret < 0) {
		kva__err(ret, "metadata memfd of %llu bytes: %s",
			 (unsigned long long)m.meta_bytes, strerror(-ret));
		goto fail;
	}
	if (!dev && (ret = host_data(&h, &l, o, &data_fd)) < 0)
		goto fail;
	h.checksum = kva__header_checksum(&h);

	if ((ret = kva__region_map(meta_fd, meta_size, false, &meta)) < 0) {
		kva__err(ret, "mapping the metadata region: %s", strerror(-ret));
		goto fail;
	}
	if ((ret = meta_init(meta, &h)) < 0) {
		kva__err(ret, "the slots' reclaim leases: %s", strerror(-ret));
		goto fail;
	}
	munmap(meta, meta_size);
	meta = NULL;
	if ((ret = kva__region_seal(meta_fd)) < 0 ||
	    (data_fd >= 0 && (ret = kva__region_seal(data_fd)) < 0)) {
		kva__err(ret, "sealing the regions: %s", strerror(-ret));
		goto fail;
	}
	/* from here on the creator is one more opener */
	if (!dev) {
		ret = kva_arena_open(meta_fd, data_fd, out);
	} else if ((ret = kva__arena_open_meta(meta_fd, 0, out)) == 0) {
		kva__arena_set_dev(*out, dev);
		dev = NULL;
	}
fail:
	if (meta)
		munmap(meta, meta_size);
	if (meta_fd >= 0)
		close(meta_fd);
	if (data_fd >= 0)
		close(data_fd);
	kva__err_hold(true);
	kva__dev_close(dev);
	kva__err_hold(false);
	return ret;
}

int kva_arena_open(int meta_fd, int data_fd, struct kva_arena **out)
{
	return kva_arena_open_flags(meta_fd, data_fd, 0, out);
}

/* the pointers into the metadata, and the info, from the validated header */
static void arena_fill(struct kva_arena *a)
{
	a->blocks = a->hdr.blocks;
	a->max_workers = a->hdr.max_workers;
	a->l0_words = (uint32_t)a->hdr.l0_words;
	a->l1_words = (uint32_t)a->hdr.l1_words;
	a->pool = (struct kva__pool *)(a->meta + a->hdr.pool_off);
	a->slots = (struct kva__slot *)(a->meta + a->hdr.slots_off);
	a->desc = (_Atomic uint64_t *)(a->meta + a->hdr.desc_off);
	a->l0 = (_Atomic uint64_t *)(a->meta + a->hdr.l0_off);
	a->l1 = (_Atomic uint64_t *)(a->meta + a->hdr.l1_off);
	a->idx = (struct kva__pentry *)(a->meta + a->hdr.idx_off);
	a->bmeta = (struct kva__bmeta *)(a->meta + a->hdr.bmeta_off);
	a->dirty = (_Atomic uint64_t *)(a->meta + a->hdr.dirty_off);
	a->dsum = (_Atomic uint64_t *)(a->meta + a->hdr.dsum_off);
	a->fetch = (struct kva__fetch_area *)(a->meta + a->hdr.fetch_off);
	a->idx_mask = a->hdr.idx_entries - 1;

	a->info.geometry = (struct kva_geometry){
		.block_tokens = a->hdr.block_tokens, .layers = a->hdr.layers,
		.kv_heads = a->hdr.kv_heads, .head_dim = a->hdr.head_dim,
		.dtype = (enum kva_dtype)a->hdr.dtype, .layout = (enum kva_layout)a->hdr.layout,
	};
	kva_geometry_layout(&a->info.geometry, a->blocks, &a->info.layout);
	a->info.blocks = a->blocks;
	a->info.max_workers = a->max_workers;
	a->info.cache_blocks = a->hdr.cache_blocks;
	a->info.hugetlb = !!(a->hdr.flags & KVA__HDR_HUGETLB);
	a->info.numa_node = a->hdr.numa_node;
	a->info.meta_bytes = a->hdr.meta_bytes;
	a->info.alloc_meta_bytes = a->hdr.idx_off - a->hdr.desc_off;
	a->info.index_entries = a->hdr.idx_entries;
	a->info.tier_keys = a->hdr.tier_keys;
	memcpy(a->info.name, a->hdr.name, sizeof(a->info.name));
	a->info.backend = (enum kva_backend)a->hdr.backend;
	if (a->hdr.backend == KVA_BACKEND_CUDA) {
		a->info.ipc = (enum kva_cuda_ipc)a->hdr.ipc;
		memcpy(a->info.device_name, a->hdr.device_name, sizeof(a->info.device_name));
		kva__dev_uuid_str(a->hdr.device_uuid, a->info.device_uuid);
		a->info.device_total_bytes = a->hdr.device_total;
		a->info.granularity = a->hdr.granularity;
		a->info.chunk_bytes = a->hdr.chunk_bytes;
		a->info.chunks = a->hdr.chunks;
		a->info.data_map_bytes = a->hdr.map_bytes;
	} else {
		a->info.data_map_bytes = a->hdr.data_bytes;
	}
}

/*
 * Open the arena of @meta_fd, and map the data of @data_fd (a host arena),
 * or nothing of it (a GPU arena, whose device memory is imported by its
 * worker, kva__arena_set_dev, or not at all by an observer; @data_fd -1).
 * @device: the caller knows the data is on a GPU and will import it.
 */
static int open_arena(int meta_fd, int data_fd, unsigned flags, bool device,
		      struct kva_arena **out)
{
	struct kva_arena *a;
	uint64_t meta_size, data_size = 0;
	bool sound;
	void *p;
	ssize_t n;
	int ret;

	if (!out || (flags & ~KVA_OPEN_READONLY))
		return kva__err(-EINVAL, "kva_arena_open: bad argument");
	kva__err_clear();
	if (meta_fd < 0)
		return kva__err(-EBADF, "kva_arena_open: negative fd");
	if ((ret = kva__region_size(meta_fd, &meta_size)) < 0)
		return kva__err(ret, "metadata fd: not a memory file (%s)", strerror(-ret));
	if (kva__region_seals_ok(meta_fd) < 0)
		return kva__err(-EBADMSG, "metadata fd is not sealed against shrink, grow and "
				"further seals");

	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->meta_fd = a->data_fd = -1;
	a->readonly = flags & KVA_OPEN_READONLY;
	/* a private copy, read once: what is validated is what is used */
	n = pread(meta_fd, &a->hdr, sizeof(a->hdr), 0);
	if (n != (ssize_t)sizeof(a->hdr)) {
		ret = kva__err(-EBADMSG, "metadata file is %llu bytes, shorter than a header",
			       (unsigned long long)meta_size);
		goto fail;
	}
	/* where the data is, from a header whose checksum holds; any other
	 * goes on to the full validation below, which says what is wrong */
	sound = a->hdr.magic == KVA__MAGIC && a->hdr.abi_version == KVA__ABI_VERSION &&
		a->hdr.header_bytes == sizeof(a->hdr) &&
		a->hdr.checksum == kva__header_checksum(&a->hdr);
	if (sound && a->hdr.backend == KVA_BACKEND_CUDA) {
		if (!device && !a->readonly) {
			ret = kva__err(-EMEDIUMTYPE, "the arena's data is on a GPU (%.63s): its "
				       "chunks come from the agent (kva_attach)",
				       a->hdr.device_name);
			goto fail;
		}
		if (data_fd >= 0) {
			ret = kva__err(-EBADF, "a GPU arena has no data fd");
			goto fail;
		}
	} else if (sound && device) {
		ret = kva__err(-EPROTO, "protocol: told the arena's data is on a GPU, its "
			       "header says not");
		goto fail;
	} else if (!device) {
		if (data_fd < 0) {
			ret = kva__err(-EBADF, "kva_arena_open: negative fd");
			goto fail;
		}
		if ((ret = kva__region_size(data_fd, &data_size)) < 0) {
			kva__err(ret, "data fd: not a memory file (%s)", strerror(-ret));
			goto fail;
		}
		if (kva__region_seals_ok(data_fd) < 0) {
			ret = kva__err(-EBADMSG, "data fd is not sealed against shrink, grow and "
				       "further seals");
			goto fail;
		}
	}
	if ((ret = kva__header_validate(&a->hdr, meta_size, data_size)) < 0)
		goto fail;

	a->meta_fd = fcntl(meta_fd, F_DUPFD_CLOEXEC, 0);
	if (a->meta_fd < 0 ||
	    (data_fd >= 0 && (a->data_fd = fcntl(data_fd, F_DUPFD_CLOEXEC, 0)) < 0)) {
		ret = kva__err(-errno, "duplicating the region fds: %s", strerror(errno));
		goto fail;
	}
	if ((ret = kva__region_map(a->meta_fd, meta_size, a->readonly, &p)) < 0) {
		kva__err(ret, "mapping the metadata region: %s", strerror(-ret));
		goto fail;
	}
	a->meta = p;
	if (a->data_fd >= 0) {
		if ((ret = kva__region_map(a->data_fd, data_size, a->readonly, &p)) < 0) {
			kva__err(ret, "mapping the data region: %s", strerror(-ret));
			goto fail;
		}
		/* 2 MiB pages where the system gives them (a hint, in every
		 * process that maps the data: region.c says why) */
		if (!(a->hdr.flags & KVA__HDR_HUGETLB))
			(void)kva__region_advise_huge(p, data_size);
		a->data = p;
		a->data_map_bytes = data_size;
	}
	arena_fill(a);
	*out = a;
	return 0;
fail:
	kva_arena_close(a);
	return ret;
}

int kva_arena_open_flags(int meta_fd, int data_fd, unsigned flags, struct kva_arena **out)
{
	return open_arena(meta_fd, data_fd, flags, false, out);
}

int kva__arena_open_meta(int meta_fd, unsigned flags, struct kva_arena **out)
{
	return open_arena(meta_fd, -1, flags, true, out);
}

void kva__arena_geom(const struct kva_arena *a, struct kva__dev_geom *g)
{
	memset(g, 0, sizeof(*g));
	g->ipc = a->hdr.ipc;
	g->granularity = a->hdr.granularity;
	g->chunk_bytes = a->hdr.chunk_bytes;
	g->chunks = a->hdr.chunks;
	g->map_bytes = a->hdr.map_bytes;
	g->total_bytes = a->hdr.device_total;
	memcpy(g->uuid, a->hdr.device_uuid, sizeof(g->uuid));
	memcpy(g->name, a->hdr.device_name, sizeof(g->name));
}

void kva__arena_set_dev(struct kva_arena *a, struct kva__dev *d)
{
	a->dev = d;
	a->data = (uint8_t *)(uintptr_t)kva__dev_base(d);
	a->data_map_bytes = a->hdr.map_bytes;
}

void kva_arena_close(struct kva_arena *a)
{
	if (!a)
		return;
	if (a->meta)
		munmap(a->meta, a->hdr.meta_bytes);
	if (a->dev)
		kva__dev_close(a->dev);
	else if (a->data)
		munmap(a->data, a->data_map_bytes);
	if (a->meta_fd >= 0)
		close(a->meta_fd);
	if (a->data_fd >= 0)
		close(a->data_fd);
	free(a);
}

/*
 * kva__arena_prefault - every page of both regions in memory now, so that a
 * shortage shows at start rather than as a worker's SIGBUS. Asks the kernel
 * to fault them in (MADV_POPULATE_WRITE, which reports a failure instead of
 * signalling it); older kernels get each page written.
 */
int kva__arena_prefault(struct kva_arena *a)
{
	struct { uint8_t *p; uint64_t n; } r[2] = {
		{ a->meta, a->hdr.meta_bytes }, { a->data, a->data_map_bytes } };

	if (a->readonly)
		return -EROFS;
	/* device memory is there once made: only the metadata is the host's */
	for (int k = 0; k < (a->dev ? 1 : 2); k++) {
#ifdef MADV_POPULATE_WRITE
		if (madvise(r[k].p, r[k].n, MADV_POPULATE_WRITE) == 0)
			continue;
		if (errno != EINVAL)
			return -errno;
#endif
		/* metadata pages are live shared words: add zero, atomically */
		for (uint64_t off = 0; off < r[k].n; off += 4096)
			__atomic_fetch_add((uint8_t *)r[k].p + off, 0, __ATOMIC_RELAXED);
	}
	return 0;
}

/*
 * kva__arena_pages - what pages a host arena's data is on, as a phrase for
 * the agent's log: hugetlb pages, how much of it 2 MiB transparent huge
 * pages map in this process (what has been touched: all of it after a
 * prefault), or why it is on 4 KiB pages. "" for device memory.
 */
void kva__arena_pages(const struct kva_arena *a, char *buf, size_t len)
{
	char thp[32];
	int64_t huge;

	if (a->dev || !a->data) {
		if (len)
			buf[0] = '\0';
		return;
	}
	if (a->hdr.flags & KVA__HDR_HUGETLB) {
		snprintf(buf, len, "on 2 MiB hugetlb pages");
		return;
	}
	kva__thp_shmem(thp, sizeof(thp));
	huge = kva__region_huge_bytes(a->data);
	if (!strcmp(thp, "never") || !strcmp(thp, "deny") || !thp[0])
		snprintf(buf, len, "on 4 KiB pages (transparent huge pages for shmem are %s%s%s: "
			 "--hugepages, or \"advise\" in /sys/kernel/mm/transparent_hugepage/"
			 "shmem_enabled, puts it on 2 MiB pages, a page walk every 2 MiB the "
			 "decode reads instead of every 4 KiB)",
			 thp[0] ? "\"" : "", thp[0] ? thp : "not in this kernel", thp[0] ? "\"" : "");
	else if (huge >= 0)
		snprintf(buf, len, "%.1f of %.1f MiB on 2 MiB transparent huge pages so far "
			 "(shmem_enabled \"%s\"; pages are made as they are first touched)",
			 (double)huge / (1 << 20), (double)a->data_map_bytes / (1 << 20), thp);
	else
		snprintf(buf, len, "on transparent huge pages where the kernel gives them "
			 "(shmem_enabled \"%s\")", thp);
}

const struct kva_arena_info *kva_arena_info(const struct kva_arena *a)
{
	return a ? &a->info : NULL;
}

int kva_arena_meta_fd(const struct kva_arena *a)
{
	return a ? a->meta_fd : -EINVAL;
}

int kva_arena_data_fd(const struct kva_arena *a)
{
	if (!a)
		return -EINVAL;
	return a->hdr.backend == KVA_BACKEND_CUDA ? -EMEDIUMTYPE : a->data_fd;
}

int kva_arena_set_agent(struct kva_arena *a, enum kva_agent_state state)
{
	if (!a || (unsigned)state > KVA_AGENT_STOPPING)
		return -EINVAL;
	if (a->readonly)
		return -EROFS;
	/* single writer, nothing else to publish with it: relaxed */
	atomic_store_explicit(&a->pool->agent_pid, getpid(), memory_order_relaxed);
	atomic_store_explicit(&a->pool->agent_state, state, memory_order_relaxed);
	return 0;
}

enum kva_agent_state kva_arena_agent(const struct kva_arena *a, int32_t *pid)
{
	uint32_t state;

	if (!a)
		return KVA_AGENT_NONE;
	state = atomic_load_explicit(&a->pool->agent_state, memory_order_relaxed);
	if (pid)
		*pid = atomic_load_explicit(&a->pool->agent_pid, memory_order_relaxed);
	/* never trust a word from shared memory to be in range */
	return state <= KVA_AGENT_STOPPING ? (enum kva_agent_state)state : KVA_AGENT_NONE;
}
