/* SPDX-License-Identifier: MIT */
/*
 * disk.c - the disk tier's file and its io_uring.
 *
 * One file per arena in the operator's --disk-dir, kvarena-<arena>.tier,
 * locked (flock) against a second agent, preallocated (fallocate) so that
 * a full file system shows at start and not in the middle of serving, and
 * opened O_DIRECT: records go from the host tier's pinned memory to the
 * device and back into arena memory without the page cache. Where the file
 * system does not take O_DIRECT (EINVAL at open: tmpfs on older kernels,
 * ramfs, some network and overlay file systems), --disk-direct auto falls
 * back to buffered I/O, said in the log, counted in the stats and shown by
 * kvarena-ctl tiers; --disk-direct require refuses to start instead.
 * Buffered writes ask the kernel not to keep the pages (RWF_DONTCACHE)
 * where it can, so the spill does not fill the page cache.
 *
 * The superblock (its first 4096 bytes) says what geometry the records are
 * for and how many slots there are; it is written, and synced, after the
 * file is sized, so a file that has one has its records where it says. A
 * file with none, or one of another geometry or record size, starts empty.
 *
 * The ring: a queue depth of --disk-queue-depth (64 by default), the file
 * registered, the host tier's memory registered as fixed buffers in pieces
 * of at most 1 GiB that end on record boundaries (one registered buffer of
 * more than 1 GiB fails with EFAULT), and a staging area for headers. A
 * memlock limit too small for those buffers is refused with a sentence
 * naming the limit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "tiers_pvt.h"

#define REG_MAX (1ull << 30)

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* the file's name: the arena's, with anything but [A-Za-z0-9._-] as '_' */
static bool file_name(char *out, size_t len, const char *dir, const char *arena)
{
	char safe[32];
	size_t i;

	for (i = 0; arena[i] && i < sizeof(safe) - 1; i++) {
		char ch = arena[i];

		safe[i] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
				  (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_'
			  ? ch
			  : '_';
	}
	safe[i] = 0;
	if (!i || safe[0] == '.')
		safe[0] = '_';
	return (size_t)snprintf(out, len, "%.*s/kvarena-%s.tier", (int)(len - 48), dir, safe) < len &&
	       strlen(dir) < len - 48;
}

static int read_super(struct disk *d, struct tier_super *s)
{
	void *buf;
	ssize_t n;

	if (posix_memalign(&buf, TIER_ALIGN, TIER_ALIGN))
		return -ENOMEM;
	n = pread(d->fd, buf, TIER_ALIGN, 0);
	memcpy(s, buf, sizeof(*s));
	free(buf);
	return n == TIER_ALIGN ? 0 : n < 0 ? -errno : -ENODATA;
}

static int write_super(struct disk *d, const struct tier_super *s)
{
	void *buf;
	ssize_t n;
	int ret = 0;

	if (posix_memalign(&buf, TIER_ALIGN, TIER_ALIGN))
		return -ENOMEM;
	memset(buf, 0, TIER_ALIGN);
	memcpy(buf, s, sizeof(*s));
	n = pwrite(d->fd, buf, TIER_ALIGN, 0);
	if (n != TIER_ALIGN)
		ret = n < 0 ? -errno : -EIO;
	else if (fdatasync(d->fd) < 0)
		ret = -errno;
	free(buf);
	return ret;
}

/* O_DIRECT's alignment on this file: statx where the kernel says it, else
 * the safe 4096 */
static void dio_align(struct disk *d)
{
	struct statx sx;

	d->dio_mem = d->dio_off = TIER_ALIGN;
	if (statx(d->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
		d->dio_mem = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : TIER_ALIGN;
		d->dio_off = sx.stx_dio_offset_align;
	}
}

int disk_open(struct disk *d, const struct tier_config *c, const struct kva_arena_info *info,
	      uint64_t fp, char *err, size_t len)
{
	struct tier_super s;
	struct statvfs vfs;
	uint64_t want;
	int ret, flags = O_RDWR | O_CREAT | O_CLOEXEC;

	d->fd = d->dirfd = d->ring_efd = -1;
	d->record_bytes = tiers_record_bytes(info->layout.block_bytes);
	d->data_off = TIER_ALIGN;
	d->records = c->disk_bytes > TIER_ALIGN ? (c->disk_bytes - TIER_ALIGN) / d->record_bytes : 0;
	if (d->records > KVA__TIER_KEYS_MAX)
		d->records = KVA__TIER_KEYS_MAX;
	if (!d->records) {
		snprintf(err, len, "disk tier: --disk-bytes %llu holds no record of %llu bytes",
			 (unsigned long long)c->disk_bytes, (unsigned long long)d->record_bytes);
		return -EINVAL;
	}
	if (mkdir(c->disk_dir, 0700) < 0 && errno != EEXIST) {
		ret = -errno;
		snprintf(err, len, "disk tier: --disk-dir %s: %s", c->disk_dir, strerror(errno));
		return ret;
	}
	if (!file_name(d->path, sizeof(d->path), c->disk_dir, info->name)) {
		snprintf(err, len, "disk tier: --disk-dir is too long");
		return -ENAMETOOLONG;
	}
	if ((ret = tier_inject_parse(c->inject, &d->inj, err, len)) < 0)
		return ret;

	d->direct = c->direct != TIER_DIRECT_OFF;
	if (d->direct) {
		int e = EINVAL;

		if (!d->inj.nodirect) {
			d->fd = open(d->path, flags | O_DIRECT, 0600);
			e = errno;
		}
		if (d->fd < 0 && e == EINVAL) {
			if (c->direct == TIER_DIRECT_REQUIRE) {
				snprintf(err, len, "disk tier: %s: the file system does not take O_DIRECT "
					 "(--disk-direct require): another --disk-dir, or --disk-direct "
					 "auto to spill through the page cache", d->path);
				return -EINVAL;
			}
			d->direct = false;
			tier_log(TLOG_WARN, "disk tier: %s: the file system does not take O_DIRECT: "
				 "buffered I/O instead (--disk-direct auto); reads and writes go "
				 "through the page cache", d->path);
		}
	}
	if (d->fd < 0)
		d->fd = open(d->path, flags, 0600);
	if (d->fd < 0) {
		ret = -errno;
		snprintf(err, len, "disk tier: %s: %s", d->path, strerror(errno));
		return ret;
	}
	/* The lock of an agent that was killed goes when the kernel has torn
	 * its io_uring down, which may finish a moment after the process: a
	 * few seconds of patience before calling the file someone else's. */
	for (int k = 0; flock(d->fd, LOCK_EX | LOCK_NB) < 0; k++) {
		if (errno != EWOULDBLOCK || k == 100) {
			ret = errno == EWOULDBLOCK ? -EBUSY : -errno;
			snprintf(err, len, "disk tier: %s is in use by another agent (flock): another "
				 "--disk-dir or arena name", d->path);
			goto fail;
		}
		if (k == 10)
			tier_log(TLOG_INFO, "disk tier: %s is locked: waiting up to 5 s for the agent "
				 "that had it (its I/O may still be finishing)", d->path);
		usleep(50000);
	}
	if (d->direct)
		dio_align(d);
	if (d->direct && (d->dio_off > TIER_ALIGN || d->dio_mem > TIER_ALIGN)) {
		snprintf(err, len, "disk tier: %s wants O_DIRECT alignment of %u (memory) and %u "
			 "(offsets), more than %u", d->path, d->dio_mem, d->dio_off, TIER_ALIGN);
		ret = -EINVAL;
		goto fail;
	}

	/* an earlier run's records, if the superblock says they are ours */
	if (read_super(d, &s) == 0 && !tier_super_check(&s) && s.fingerprint == fp &&
	    s.record_bytes == d->record_bytes) {
		d->old_records = s.records < d->records ? s.records : d->records;
		d->fresh = false;
	} else {
		d->fresh = true;
		d->old_records = 0;
	}
	want = d->data_off + d->records * d->record_bytes;
	if (!d->fresh && s.records > d->records) {
		tier_log(TLOG_INFO, "disk tier: %s held %llu records, --disk-bytes keeps %llu",
			 d->path, (unsigned long long)s.records, (unsigned long long)d->records);
		if (ftruncate(d->fd, (off_t)want) < 0) {
			ret = -errno;
			snprintf(err, len, "disk tier: %s: %s", d->path, strerror(errno));
			goto fail;
		}
	}
	if (d->fresh) {
		/* no superblock until the file is its size: a file that has one
		 * has its records where it says */
		if (ftruncate(d->fd, 0) < 0 || fdatasync(d->fd) < 0) {
			ret = -errno;
			snprintf(err, len, "disk tier: %s: %s", d->path, strerror(errno));
			goto fail;
		}
	}
	ret = fallocate(d->fd, 0, 0, (off_t)want);
	d->prealloc = ret == 0;
	if (ret < 0) {
		int e = errno;
		unsigned long long avail = 0;

		if (fstatvfs(d->fd, &vfs) == 0)
			avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
		if (ftruncate(d->fd, (off_t)want) < 0) {
			ret = -errno;
			snprintf(err, len, "disk tier: %s: sizing it to %llu bytes: %s", d->path,
				 (unsigned long long)want, strerror(errno));
			goto fail;
		}
		tier_log(TLOG_WARN, "disk tier: %s: preallocating %.1f MiB: %s (%.1f MiB free): the "
			 "file is sparse; a write that finds no space fails, and the tier stops "
			 "writing until a retry works", d->path, (double)want / (1 << 20),
			 strerror(e), (double)avail / (1 << 20));
	}
	if (d->fresh || s.records != d->records) {
		tier_super_fill(&s, fp, d->record_bytes, d->records, info->name);
		if ((ret = write_super(d, &s)) < 0) {
			snprintf(err, len, "disk tier: %s: writing its superblock: %s", d->path,
				 strerror(-ret));
			goto fail;
		}
	}
	/* buffered: ask for uncached writes (Linux 6.14 on some file systems) */
	if (!d->direct) {
		struct iovec iov;
		void *buf;

		if (!posix_memalign(&buf, TIER_ALIGN, TIER_ALIGN)) {
			memset(buf, 0, TIER_ALIGN);
			tier_super_fill(&s, fp, d->record_bytes, d->records, info->name);
			memcpy(buf, &s, sizeof(s));
			iov = (struct iovec){ buf, TIER_ALIGN };
			d->dontcache = pwritev2(d->fd, &iov, 1, 0, RWF_DONTCACHE) == TIER_ALIGN;
			free(buf);
		}
	}
	return 0;
fail:
	close(d->fd);
	d->fd = -1;
	return ret;
}

static uint64_t memlock_limit(void)
{
	struct rlimit rl;

	return getrlimit(RLIMIT_MEMLOCK, &rl) == 0 ? (uint64_t)rl.rlim_cur : 0;
}

/*
 * Can a record's data be read with O_DIRECT straight into an arena block?
 * Block-major: yes (a block starts on a page and its stride is whole pages,
 * so the record's padding lands in the block's own). Layer-major: if every
 * page of a block is aligned in memory and whole sectors long, and so is
 * the padding after them (it lands in staging). Block 0 and 1 decide for
 * all: the offsets are linear in the block. A GPU arena's blocks never: the
 * disk reads into staging and the tier thread copies it up.
 */
static bool pieces_aligned(const struct disk *d, const struct kva_arena_info *info)
{
	struct kva__piece p[1024];
	uint32_t n;

	if (info->backend == KVA_BACKEND_CUDA)
		return false;

	if (!d->direct || info->layout.block_stride)
		return true;
	if (kva__rec_pieces_max(info) > 1024)
		return false;
	for (uint32_t b = 0; b < 2 && b < info->blocks; b++) {
		n = kva__rec_pieces(info, b, p);
		for (uint32_t i = 0; i < n; i++)
			if (p[i].off % d->dio_mem || p[i].len % d->dio_off)
				return false;
	}
	return (round_up(info->layout.block_bytes, TIER_ALIGN) - info->layout.block_bytes) %
		       d->dio_off == 0;
}

int disk_ring(struct disk *d, const struct host_mem *h, const struct kva_arena_info *info,
	      char *err, size_t len)
{
	struct io_uring_params par = { 0 };
	uint64_t piece, regs_bytes = 0;
	uint32_t pieces_max = kva__rec_pieces_max(info) + 2;
	int ret;

	d->qd = d->qd ? d->qd : 64;
	/* no COOP_TASKRUN (a completion would wait for our next syscall, not
	 * wake the epoll we sleep in), no SINGLE_ISSUER (the ring is made by
	 * the agent's main thread, used by the tier thread) */
	ret = io_uring_queue_init_params(2 * d->qd, &d->ring, &par);
	if (ret < 0) {
		snprintf(err, len, "disk tier: io_uring: %s%s", strerror(-ret),
			 ret == -EPERM ? " (kernel.io_uring_disabled?)" : "");
		return ret;
	}
	d->ring_ok = true;
	if ((ret = io_uring_register_files(&d->ring, &d->fd, 1)) < 0) {
		snprintf(err, len, "disk tier: registering the file with io_uring: %s",
			 strerror(-ret));
		return ret;
	}
	d->staged_reads = !pieces_aligned(d, info);
	d->staging_bytes = (uint64_t)d->qd * TIER_HDR_BYTES +
			   (d->staged_reads ? (uint64_t)d->qd * d->record_bytes : 0) +
			   TIER_ALIGN /* the padding of a direct read lands here */;
	d->staging = mmap(NULL, d->staging_bytes, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (d->staging == MAP_FAILED) {
		d->staging = NULL;
		snprintf(err, len, "disk tier: %llu bytes of staging: %s",
			 (unsigned long long)d->staging_bytes, strerror(errno));
		return -ENOMEM;
	}
	/* the host tier in pieces that hold whole records, at most 1 GiB */
	piece = REG_MAX / d->record_bytes * d->record_bytes;
	if (!piece) {
		snprintf(err, len, "disk tier: a record of %llu bytes is more than one io_uring "
			 "buffer takes (1 GiB)", (unsigned long long)d->record_bytes);
		return -EINVAL;
	}
	d->host_regs = h->bytes ? (uint32_t)((h->bytes + piece - 1) / piece) : 0;
	d->n_regs = d->host_regs + 1;
	d->regs = calloc(d->n_regs, sizeof(*d->regs));
	if (!d->regs)
		return -ENOMEM;
	for (uint32_t i = 0; i < d->host_regs; i++) {
		uint64_t off = i * piece, n = h->bytes - off < piece ? h->bytes - off : piece;

		d->regs[i] = (struct iovec){ h->base + off, n };
		regs_bytes += n;
	}
	d->regs[d->host_regs] = (struct iovec){ d->staging, d->staging_bytes };
	regs_bytes += d->staging_bytes;
	if ((ret = io_uring_register_buffers(&d->ring, d->regs, d->n_regs)) < 0) {
		uint64_t lim = memlock_limit();

		if (ret == -ENOMEM && lim != (uint64_t)RLIM_INFINITY && lim < regs_bytes)
			snprintf(err, len, "disk tier: io_uring must pin %.1f MiB of buffers (the "
				 "host tier and staging), the memlock limit is %.1f MiB: raise it "
				 "(ulimit -l, LimitMEMLOCK= in the unit) or give the agent "
				 "CAP_IPC_LOCK", (double)regs_bytes / (1 << 20),
				 (double)lim / (1 << 20));
		else
			snprintf(err, len, "disk tier: registering %.1f MiB of buffers with io_uring: "
				 "%s", (double)regs_bytes / (1 << 20), strerror(-ret));
		return ret;
	}
	d->ring_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->ring_efd < 0 || io_uring_register_eventfd(&d->ring, d->ring_efd) < 0) {
		ret = -errno;
		snprintf(err, len, "disk tier: an eventfd for the ring: %s", strerror(errno));
		return ret;
	}
	d->ops = calloc(d->qd, sizeof(*d->ops));
	if (!d->ops)
		return -ENOMEM;
	for (uint32_t i = 0; i < d->qd; i++) {
		d->ops[i].next_free = i + 1 < d->qd ? i + 1 : UINT32_MAX;
		d->ops[i].iov = calloc(pieces_max, sizeof(struct iovec));
		if (!d->ops[i].iov)
			return -ENOMEM;
	}
	d->free_op = 0;
	return 0;
}

void disk_close(struct disk *d)
{
	/* the file and buffers first, synchronously: the ring's own teardown
	 * runs after the close, and would keep the file (and its lock) a
	 * moment longer than the agent */
	if (d->ring_ok) {
		io_uring_unregister_files(&d->ring);
		io_uring_unregister_buffers(&d->ring);
		io_uring_queue_exit(&d->ring);
	}
	d->ring_ok = false;
	if (d->ops)
		for (uint32_t i = 0; i < d->qd; i++)
			free(d->ops[i].iov);
	free(d->ops);
	d->ops = NULL;
	free(d->regs);
	d->regs = NULL;
	if (d->staging)
		munmap(d->staging, d->staging_bytes);
	d->staging = NULL;
	if (d->ring_efd >= 0)
		close(d->ring_efd);
	d->ring_efd = -1;
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
}
