/* SPDX-License-Identifier: MIT */
/*
 * host.c - the host tier's memory: one memfd the agent alone writes
 * (workers map it read-only and copy a record out under its seqlock,
 * checking its key and hash before they use a byte), on huge pages when
 * the system has them to give, else ordinary pages with transparent huge
 * pages asked for, bound to a NUMA node with libnuma, and faulted in at
 * start: a cache tier is memory the node has set aside, so its first copies
 * do not pay a page fault each (and a machine without the memory says so
 * at start, not later).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tiers_pvt.h"

int host_mem_create(struct host_mem *h, uint64_t bytes, int32_t node, bool hugepages, char *err,
		    size_t len)
{
	uint64_t mapped = 0;
	void *p;
	int ret = -1;

	memset(h, 0, sizeof(*h));
	h->fd = -1;
	h->node = node;
	if (hugepages)
		ret = kva__region_create("kvarena-host-tier", bytes, true, &h->fd, &mapped);
	h->hugetlb = ret == 0;
	if (ret < 0 &&
	    (ret = kva__region_create("kvarena-host-tier", bytes, false, &h->fd, &mapped)) < 0) {
		snprintf(err, len, "host tier: a memfd of %llu bytes: %s",
			 (unsigned long long)bytes, ret == -EFBIG ? kva_errmsg() : strerror(-ret));
		return ret;
	}
	if ((ret = kva__region_map(h->fd, mapped, false, &p)) < 0) {
		snprintf(err, len, "host tier: mapping %llu bytes: %s", (unsigned long long)mapped,
			 strerror(-ret));
		close(h->fd);
		h->fd = -1;
		return ret;
	}
	h->base = p;
	h->bytes = mapped;
	if (!h->hugetlb)
		madvise(p, mapped, MADV_HUGEPAGE); /* a hint: shmem THP may be off */
	if (node >= 0 && (ret = kva__region_bind_node(p, mapped, node)) < 0) {
		snprintf(err, len, "host tier: binding %llu bytes to NUMA node %d: %s",
			 (unsigned long long)mapped, node,
			 ret == -EINVAL ? "no such node" : strerror(-ret));
		host_mem_destroy(h);
		return ret;
	}
	if (madvise(p, mapped, MADV_POPULATE_WRITE) < 0) {
		if (errno != EINVAL) { /* EINVAL: a kernel before 5.14 */
			snprintf(err, len, "host tier: %llu bytes are not there: %s",
				 (unsigned long long)mapped, strerror(errno));
			host_mem_destroy(h);
			return -ENOMEM;
		}
		for (uint64_t o = 0; o < mapped; o += 4096)
			((volatile uint8_t *)p)[o] = 0;
	}
	return 0;
}

void host_mem_destroy(struct host_mem *h)
{
	if (h->base)
		munmap(h->base, h->bytes);
	if (h->fd >= 0)
		close(h->fd);
	h->base = NULL;
	h->fd = -1;
}
