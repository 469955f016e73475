/* SPDX-License-Identifier: MIT */
/*
 * main.c - kvarena-agent: read the configuration, make the arena, serve.
 */
#include <errno.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "arena_pvt.h"

/* The number of blocks --memory holds, for the geometry. */
static int blocks_for_memory(const struct agent_config *c, uint32_t *blocks)
{
	struct kva_block_layout l;
	uint64_t per_block, n;

	if (kva_geometry_layout(&c->geometry, 1, &l) < 0) {
		log_err("geometry: %s", kva_errmsg());
		return -EINVAL;
	}
	per_block = c->geometry.layout == KVA_LAYOUT_BLOCK_MAJOR
			    ? l.block_stride
			    : 2ull * c->geometry.layers * (l.page_bytes + l.scale_bytes);
	n = c->memory / per_block;
	if (n > KVA_MAX_BLOCKS)
		n = KVA_MAX_BLOCKS;
	/* layer-major pools are rounded up to pages: step down until it fits */
	while (n && kva_geometry_layout(&c->geometry, (uint32_t)n, &l) == 0 &&
	       l.data_bytes > c->memory)
		n--;
	if (!n) {
		log_err("--memory %llu bytes holds no block of %llu bytes",
			(unsigned long long)c->memory, (unsigned long long)per_block);
		return -EINVAL;
	}
	*blocks = (uint32_t)n;
	return 0;
}

/*
 * The arena must fit the memory there is: a 1 TiB arena on a 24 GiB machine
 * starts (memfds are lazy), then fails a worker at a random page with SIGBUS
 * or OOM, and the first full check faults gigabytes of index into memory.
 * Refused unless the operator says --allow-overcommit; the memory of the
 * NUMA node when bound to one. A GPU arena's data is the device's (whose
 * memory the driver checks at creation): the host holds its metadata and
 * the host tier.
 */
static int fits_memory(const struct agent_config *c)
{
	struct kva_block_layout l;
	struct kva__meta_layout m;
	uint64_t need, have;
	const char *where = "the machine";
	char node[32];

	if (kva_geometry_layout(&c->geometry, c->blocks, &l) < 0) {
		log_err("geometry: %s", kva_errmsg());
		return -EINVAL;
	}
	kva__meta_layout(c->blocks, c->max_workers, tiers_keys(&c->tiers, l.block_bytes), &m);
	need = (agent_on_gpu(c) ? 0 : l.data_bytes) + m.meta_bytes + c->tiers.host_bytes;
	have = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	if (c->numa_node >= 0 && numa_available() >= 0) {
		long long node_bytes = numa_node_size64(c->numa_node, NULL);

		if (node_bytes > 0) {
			have = (uint64_t)node_bytes;
			snprintf(node, sizeof(node), "NUMA node %d", c->numa_node);
			where = node;
		}
	}
	if (need <= have || c->allow_overcommit)
		return 0;
	log_err("the arena needs %.1f GiB (%.1f GiB of blocks, %.1f GiB of metadata, %.1f GiB "
		"of host tier), %s has %.1f GiB of memory: a smaller --memory, --blocks or "
		"--host-bytes, or --allow-overcommit", (double)need / (1ull << 30),
		agent_on_gpu(c) ? 0.0 : (double)l.data_bytes / (1ull << 30),
		(double)m.meta_bytes / (1ull << 30),
		(double)c->tiers.host_bytes / (1ull << 30), where, (double)have / (1ull << 30));
	return -ENOMEM;
}

/*
 * --backend cuda: the device, as the driver sees it before the arena is
 * made; with --memory-fraction, the data region takes that share of its
 * free memory (as serving engines size their KV cache). The driver's own
 * context, made next, takes some of what is free: a fraction of 1 leaves
 * no room for it.
 */
static int gpu_size(struct agent_config *c)
{
	struct kva_cuda_device d;

	if (kva_cuda_device_query(c->device[0] ? c->device : NULL, &d) < 0) {
		log_err("--backend cuda: %s", kva_errmsg());
		return -ENODEV;
	}
	log_info("GPU %d: %s, %s: %.2f GiB free of %.2f GiB; VMM %s, POSIX fd handles %s, "
		 "GPUDirect RDMA %s, granularity %llu KiB", d.ordinal, d.name, d.uuid,
		 (double)d.free_bytes / (1ull << 30), (double)d.total_bytes / (1ull << 30),
		 d.vmm ? "yes" : "no", d.posix_fd ? "yes" : "no", d.rdma ? "yes" : "no",
		 (unsigned long long)d.granularity / 1024);
	if (c->memory_fraction) {
		c->memory = (uint64_t)(c->memory_fraction * (double)d.free_bytes);
		log_info("--memory-fraction %g: %.2f GiB for blocks", c->memory_fraction,
			 (double)c->memory / (1ull << 30));
	}
	return 0;
}

static void tiers_log(int level, const char *site, const char *msg)
{
	agent_log_at(level, site, "%s", msg);
}

/*
 * The agent's own worker, in the arena's last slot: the tier thread holds
 * blocks through it while it copies them. No cache: a block it frees goes
 * back to the pool at once.
 */
static int start_tiers(const struct agent_config *c, struct kva_arena *a,
		       struct kva_worker **self, struct tiers **t)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	uint32_t slot = info->max_workers - 1, gen;
	uint64_t start;
	char err[512];
	int ret;

	if ((ret = kva__slot_reserve_at(a, slot, getpid(), &gen, &start)) < 0 ||
	    (ret = kva_worker_adopt(a, slot, gen, "agent (tiers)", self)) < 0) {
		log_err("the agent's own worker slot %u: %s", slot, kva_errmsg());
		return ret;
	}
	kva_worker_set_cache(*self, 0);
	tiers_set_log(tiers_log);
	if ((ret = tiers_start(&c->tiers, a, *self, t, err, sizeof(err))) < 0) {
		log_err("%s", err);
		kva_worker_leave(*self);
		*self = NULL;
		return ret;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct agent_config c;
	struct kva_arena_opts o;
	struct kva_cuda_opts cuda;
	struct kva_arena *a;
	const struct kva_arena_info *info;
	struct kva_worker *self = NULL;
	struct tiers *tiers = NULL;
	struct kva_block_layout bl;
	int ret = agent_config_parse(argc, argv, &c);

	if (ret)
		return ret > 0 ? 0 : 2;
	agent_log_level = c.log_level;
	/* a file size limit is an error to report (EFBIG), not a death */
	signal(SIGXFSZ, SIG_IGN);
	if (agent_on_gpu(&c) && gpu_size(&c) < 0)
		return 1;
	if (!c.blocks && blocks_for_memory(&c, &c.blocks) < 0)
		return 2;
	if (fits_memory(&c) < 0)
		return 2;
	o = (struct kva_arena_opts){
		.blocks = c.blocks, .max_workers = c.max_workers,
		.cache_blocks = c.worker_cache, .numa_node = c.numa_node, .name = c.name,
		.flags = c.hugepages ? KVA_ARENA_HUGETLB : 0,
	};
	if (agent_on_gpu(&c)) {
		cuda = (struct kva_cuda_opts){ .device = c.device[0] ? c.device : NULL,
					       .chunk_bytes = c.chunk_bytes, .ipc = c.ipc };
		o.cuda = &cuda;
		o.numa_node = -1; /* the host tier's (config.c) */
	}
	if (agent_tiers_on(&c) && kva_geometry_layout(&c.geometry, 1, &bl) == 0)
		o.tier_keys = tiers_keys(&c.tiers, bl.block_bytes);
	if ((ret = kva_arena_create(&c.geometry, &o, &a)) < 0) {
		log_err("creating the arena: %s", kva_errmsg());
		return 1;
	}
	kva_arena_set_policy(a, c.evict_policy);
	kva_arena_set_quotas(a, &c.quotas);
	kva_arena_set_cache_limit(a, c.cache_limit);
	info = kva_arena_info(a);
	/* with tiers the tier thread reads every block published, through its
	 * own mapping: its pages faulted in at start, not one by one while a
	 * burst of publications waits for their copies */
	if (c.prefault || agent_tiers_on(&c)) {
		/* device memory is all there once made: the host's pages only */
		double mib = (double)((info->backend == KVA_BACKEND_CUDA ? 0 : info->layout.data_bytes) +
				      info->meta_bytes) / (1 << 20);
		uint64_t t0 = agent_now_ns();

		if ((ret = kva__arena_prefault(a)) < 0) {
			log_err("--prefault: the arena's %.1f MiB are not all there: %s", mib,
				strerror(-ret));
			kva_arena_close(a);
			return 1;
		}
		log_info("--prefault: %.1f MiB touched in %.0f ms", mib,
			 (double)(agent_now_ns() - t0) / 1e6);
	}
	log_info("arena \"%s\" (%s backend): %u blocks of %llu KiB (%u tokens x %u layers x K,V x "
		 "%u kv heads x %u x %s, %s), %.1f MiB data%s, %u worker slots, worker cache %u",
		 info->name, c.backend, info->blocks,
		 (unsigned long long)info->layout.block_bytes / 1024, c.geometry.block_tokens,
		 c.geometry.layers, c.geometry.kv_heads, c.geometry.head_dim,
		 kva_dtype_name(c.geometry.dtype),
		 c.geometry.layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major",
		 (double)info->layout.data_bytes / (1 << 20),
		 info->hugetlb ? " on huge pages" : c.hugepages ? " (no huge pages free: ordinary pages)" : "",
		 info->max_workers, info->cache_blocks);
	if (info->backend == KVA_BACKEND_HOST && !info->hugetlb) {
		char pages[512];

		kva__arena_pages(a, pages, sizeof(pages));
		log_info("data %s", pages);
	}
	log_info("prefix cache: index of %llu entries, eviction policy %s, %s%u blocks at most",
		 (unsigned long long)info->index_entries, kva_evict_policy_name(c.evict_policy),
		 c.cache_limit ? "" : "no limit: ", c.cache_limit ? c.cache_limit : info->blocks);
	if (info->backend == KVA_BACKEND_CUDA)
		log_info("GPU region on %s (%s): %.1f MiB in %u chunk%s of %.1f MiB (granularity "
			 "%llu KiB), shared by %s", info->device_name, info->device_uuid,
			 (double)info->data_map_bytes / (1 << 20), info->chunks,
			 info->chunks == 1 ? "" : "s", (double)info->chunk_bytes / (1 << 20),
			 (unsigned long long)info->granularity / 1024,
			 info->ipc == KVA_IPC_FD ? "POSIX fds (cuMemCreate)"
						 : "a legacy CUDA IPC handle (cuMemAlloc)");
	if (!info->cache_blocks && !c.worker_cache)
		log_info("no worker caches: %u blocks are too few for one (1/64 of the arena, 8 "
			 "at least); every allocation goes to the shared pool", info->blocks);
	if (agent_tiers_on(&c)) {
		/* tests only: faults on purpose in the disk tier's I/O (said loudly
		 * in the log when set) */
		c.tiers.inject = getenv("KVA_TIER_INJECT");
		if (start_tiers(&c, a, &self, &tiers) < 0) {
			kva_arena_close(a);
			return 1;
		}
		{
			struct kva_tiers_stats ts;
			const struct kva_tier_stats *h = &ts.tier[KVA_TIER_HOST],
						    *d = &ts.tier[KVA_TIER_DISK];

			kva_arena_tier_stats(a, &ts);
			log_info("host tier: %llu records of %llu KiB (%.1f MiB)%s%s; worker slot %u "
				 "is the agent's", (unsigned long long)h->capacity_records,
				 (unsigned long long)h->record_bytes / 1024,
				 (double)(h->capacity_records * h->record_bytes) / (1 << 20),
				 h->hugetlb ? " on huge pages" : "",
				 c.tiers.host_bytes ? "" : " (the disk tier's staging)",
				 info->max_workers - 1);
			if (d->enabled)
				log_info("disk tier: %s, %llu records (%.1f MiB), %s I/O%s, queue depth "
					 "%u%s", d->path, (unsigned long long)d->capacity_records,
					 (double)(d->capacity_records * d->record_bytes) / (1 << 20),
					 d->direct ? "O_DIRECT" : "buffered",
					 d->preallocated ? ", preallocated" : ", sparse",
					 d->queue_depth,
					 d->warming ? "; records of an earlier run being scanned" : "");
		}
	}
	ret = agent_serve(&c, a, self, tiers);
	tiers_stop(tiers);
	if (self)
		kva_worker_leave(self);
	kva_arena_close(a);
	return ret < 0 ? 1 : 0;
}
