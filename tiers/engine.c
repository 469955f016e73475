/* SPDX-License-Identifier: MIT */
/*
 * engine.c - the tier thread: one thread of the agent that keeps copies of
 * published blocks below the arena, moves them down, and serves fetches.
 *
 * It is a worker of the agent's own arena (a slot of its own), so it holds
 * a block exactly as any worker does: a holder bit, which the allocator,
 * eviction and reclaim all respect. Its round:
 *
 *   reap      io_uring completions: runs written, fetch reads, the warm
 *             restart's header reads
 *   serve     fetch requests (first: a request is someone's latency); a
 *             worker copies host records itself, so what reaches us is
 *             disk reads and host records rewritten under it
 *   back      published blocks marked dirty (prefix/fetch.c), from the
 *             eviction hand on: hold, copy to a host record with its
 *             checksum, write where the copy is into the block's meta
 *             (backing), let go; a budget of bytes a round
 *   flush     with a disk tier the host tier is a ring: the records not on
 *             disk yet are written, in order, as one sequential run of up
 *             to 1 MiB (WRITE_FIXED) at the disk log's head, which
 *             overwrites the oldest records on disk; without one, the
 *             coldest host records (clock) are dropped to make room
 *   scan      at a warm restart, the disk tier's records of the earlier run
 *
 * and when a round finds nothing to do it sleeps on an epoll of the
 * doorbell (workers ring it: a fetch posted, a publication marked), the
 * ring's eventfd and a 50 ms timer, after saying so in shared memory
 * (pool->sleeping, a Dekker pair with the workers' bits).
 *
 * The crash argument, step by step:
 *   back      a record is whole (bytes, checksum, header) before the
 *             block's backing names it, and the backing is written while
 *             the block is held, so an evictor (acquire) sees it complete.
 *             Killed before: no backing, the eviction loses the bytes as
 *             without tiers. A worker killed meanwhile: reclaim drops its
 *             bit; ours keeps the block in its life until we let go
 *   flush     a host record's names move to its disk copy only after the
 *             run's write completed, and only when the ring reuses the host
 *             record; until then the host copy serves. A disk record
 *             overwritten by the log loses its names (index entries
 *             retired, backings cleared, blocks still in the arena marked
 *             dirty for a new copy) before the write is submitted. Killed
 *             mid-write: the host tier is gone with the agent, the torn
 *             disk records fail their checksum at the restart's scan or at
 *             their first read
 *   fetch     the requester's block is held by us while we write it, and
 *             DONE is stored after our last write and our drop; the record is
 *             verified (header: key, geometry, length; data: XXH3-64) into
 *             the block before DONE. Killed mid-read: the requester times out
 *             or sees the agent gone and cancels; its block is freed by
 *             whoever holds it last
 * On a GPU arena the tier thread copies blocks with the driver, on a stream
 * of its own, between device memory and host memory it pinned (the host
 * tier, the disk's staging): down with cuMemcpyDtoHAsync, then the hash on
 * the host copy; up only after the record's bytes hashed right, with
 * cuMemcpyHtoDAsync, waited for before DONE. Disk reads always land in
 * staging. Its workers get no host tier mapping: every fetch comes here.
 *
 * Nothing is believed from shared memory: request fields are checked
 * against the arena and our own record table, descriptors by CAS, and a
 * location read from an index entry is only ever a hint that the record's
 * own header confirms or refutes.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "devmem_pvt.h"
#include "tiers_pvt.h"

#define BACK_BUDGET (32ull << 20)   /* bytes copied to the host tier per round */
#define SERVE_BUDGET 256u           /* host-tier requests served per round */
#define VIEW_NS 100000000ull
#define TIER_NICE (-10)
#define IDLE_MS 50
#define RETRY_MIN_NS 1000000000ull  /* a degraded disk tier tries again after 1 s, */
#define RETRY_MAX_NS 30000000000ull /* doubling to 30 s */

/* ------------------------------------------------------------ logging */

static tiers_log_fn *log_fn;

void tiers_set_log(tiers_log_fn *fn)
{
	log_fn = fn;
}

void tier_log(int level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_fn)
		log_fn(level, fmt, msg);
	else
		fprintf(stderr, "kvarena tiers: %s\n", msg);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

uint64_t tiers_record_bytes(uint64_t block_bytes)
{
	_Static_assert(TIER_HDR_BYTES == 4096 && TIER_ALIGN == 4096,
		       "kva_tier_record_bytes() says the same");
	return kva_tier_record_bytes(block_bytes);
}

/* the host tier of a disk-only configuration: staging for the writes */
static uint64_t host_bytes_of(const struct tier_config *c, uint64_t rec)
{
	uint32_t qd = c->queue_depth ? c->queue_depth : 64;

	if (c->host_bytes || !c->disk_dir[0])
		return c->host_bytes;
	return 4ull * qd * rec;
}

uint64_t tiers_keys(const struct tier_config *c, uint64_t block_bytes)
{
	uint64_t rec = tiers_record_bytes(block_bytes), n = host_bytes_of(c, rec) / rec;

	if (c->disk_dir[0] && c->disk_bytes > TIER_ALIGN)
		n += (c->disk_bytes - TIER_ALIGN) / rec;
	return n > KVA__TIER_KEYS_MAX ? KVA__TIER_KEYS_MAX : n;
}

/* ------------------------------------------------------------ records */

enum { HOST = 0, DISK = 1 };
static const uint32_t loc_tier_of[2] = { KVA__LOC_HOST, KVA__LOC_DISK };

static uint64_t rec_loc(const struct tiers *t, int k, uint32_t i)
{
	return kva__loc_make(loc_tier_of[k], t->t[k].rec[i].gen, i);
}

static void free_push(struct tier *tr, uint32_t i)
{
	tr->rec[i].state = R_FREE;
	tr->rec[i].gen = (tr->rec[i].gen + 1) & KVA__LOC_GEN_MASK;
	tr->rec[i].other = TIER_NONE;
	tr->rec[i].next_free = tr->free_head;
	tr->free_head = i;
}

static uint32_t free_pop(struct tier *tr)
{
	uint32_t i = tr->free_head;

	if (i == UINT32_MAX)
		return i;
	tr->free_head = tr->rec[i].next_free;
	return i;
}

static uint32_t free_count(const struct tier *tr)
{
	return tr->n - tr->used;
}

/*
 * unname - nothing names record @i of tier @k any more: its spilled entry
 * (if it still names it) becomes a plain ghost, and an arena block whose
 * backing names it forgets it. Both best effort: a name we miss costs a
 * miss, the record's header refutes it.
 */
static void unname(struct tiers *t, const uint64_t key[2], uint64_t loc)
{
	struct kva_arena *a = t->a;
	struct kva__found f;

	if (kva__index_lookup_spilled(a, key, &f) && kva__p_loc(f.ctrl) == loc)
		kva__index_unspill(a, f.pos, f.ctrl);
	if (kva__index_lookup(a, key, &f, NULL)) {
		uint32_t id = kva__p_block(f.ctrl);
		uint64_t b = loc;

		/* still in the arena: it needs a copy below again */
		if (atomic_compare_exchange_strong_explicit(&a->bmeta[id].backing, &b, 0,
							    memory_order_relaxed, memory_order_relaxed)) {
			atomic_fetch_or(&a->dirty[id / 64], 1ull << (id % 64));
			atomic_fetch_or(&a->dsum[id / 4096], 1ull << (id / 64 % 64));
		}
	}
}

/* moved from @from to @to: the names follow */
static void rename_loc(struct tiers *t, const uint64_t key[2], uint64_t from, uint64_t to)
{
	struct kva_arena *a = t->a;
	struct kva__found f;

	if (kva__index_lookup_spilled(a, key, &f) && kva__p_loc(f.ctrl) == from)
		kva__index_respill(a, f.pos, f.ctrl, to);
	if (kva__index_lookup(a, key, &f, NULL)) {
		uint64_t b = from;

		atomic_compare_exchange_strong_explicit(&a->bmeta[kva__p_block(f.ctrl)].backing, &b, to,
							memory_order_relaxed, memory_order_relaxed);
	}
}

/* record @i of tier @k holds nothing any more (a new generation) */
static void rec_free(struct tiers *t, int k, uint32_t i)
{
	struct tier *tr = &t->t[k];

	if (k == HOST && !tr->ring) {
		free_push(tr, i);
		return;
	}
	tr->rec[i].state = R_FREE;
	tr->rec[i].gen = (tr->rec[i].gen + 1) & KVA__LOC_GEN_MASK;
}

/* drop record @i of tier @k: unnamed, and free once no I/O uses it */
static void drop(struct tiers *t, int k, uint32_t i)
{
	struct tier *tr = &t->t[k];
	struct tier_rec *r = &tr->rec[i];

	if (r->state == R_VALID) {
		unname(t, r->key, rec_loc(t, k, i));
		tr->used--;
	}
	/* the copy in the other tier is no copy of anything now */
	if (r->other != TIER_NONE) {
		t->t[!k].rec[r->other].other = TIER_NONE;
		r->other = TIER_NONE;
	}
	if (r->users)
		r->state = R_DEAD;
	else
		rec_free(t, k, i);
}

/* the clock's next victim among valid records nobody is reading; UINT32_MAX */
static uint32_t victim(struct tier *tr)
{
	for (uint64_t steps = 0; steps < 2ull * tr->n + 1; steps++) {
		uint32_t i = tr->hand;
		struct tier_rec *r = &tr->rec[i];

		tr->hand = i + 1 == tr->n ? 0 : i + 1;
		if (r->state != R_VALID || r->users)
			continue;
		if (r->ref) {
			r->ref = 0;
			continue;
		}
		return i;
	}
	return UINT32_MAX;
}

static void degrade(struct tiers *t, int k, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void degrade(struct tiers *t, int k, const char *fmt, ...)
{
	struct tier *tr = &t->t[k];
	uint64_t now = now_ns(), wait;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tr->reason, sizeof(tr->reason), fmt, ap);
	va_end(ap);
	tr->io_errors++;
	t->view_now = true;
	if (!tr->degraded) {
		tr->degraded = true;
		tr->degraded_since = now;
		tr->retry_at = now + RETRY_MIN_NS;
		tier_log(TLOG_ERR, "%s tier degraded: %s: its blocks are misses, no new writes "
			 "until a retry in %.0f s works", k ? "disk" : "host", tr->reason,
			 RETRY_MIN_NS / 1e9);
		return;
	}
	/* a retry failed: wait longer */
	wait = tr->retry_at > tr->degraded_since ? 2 * (tr->retry_at - tr->degraded_since) : 0;
	wait = wait < RETRY_MIN_NS ? RETRY_MIN_NS : wait > RETRY_MAX_NS ? RETRY_MAX_NS : wait;
	tr->retry_at = now + wait;
}

static void recovered(struct tiers *t, int k)
{
	struct tier *tr = &t->t[k];

	if (!tr->degraded)
		return;
	tr->degraded = false;
	t->view_now = true;
	tier_log(TLOG_WARN, "%s tier recovered after %.1f s degraded (%s)", k ? "disk" : "host",
		 (now_ns() - tr->degraded_since) / 1e9, tr->reason);
}

static void hist_add(struct tier *tr, uint64_t ns)
{
	tr->hist[kva__hist_bucket(ns)]++;
}

/* the @q quantile of @n buckets of @h */
static uint64_t hist_quantile(const uint64_t *h, unsigned n, double q)
{
	uint64_t total = 0, acc = 0;

	for (unsigned b = 0; b < n; b++)
		total += h[b];
	if (!total)
		return 0;
	for (unsigned b = 0; b < n; b++) {
		acc += h[b];
		if ((double)acc >= q * (double)total)
			return kva__hist_value(b);
	}
	return kva__hist_value(n - 1);
}

/* ------------------------------------------------------------ our holds */

static void release(struct tiers *t, uint32_t id)
{
	if (kva_free(t->self, &id, 1) == 0)
		return;
	/* our slot word overwritten (the agent restores it within a tick):
	 * keep the block and let go of it then */
	if (t->n_unreleased == t->cap_unreleased) {
		uint32_t cap = t->cap_unreleased ? 2 * t->cap_unreleased : 64;
		uint32_t *p = realloc(t->unreleased, cap * sizeof(*p));

		if (!p) {
			tier_log(TLOG_ERR, "out of memory: block %u stays held by the agent", id);
			return;
		}
		t->unreleased = p;
		t->cap_unreleased = cap;
	}
	t->unreleased[t->n_unreleased++] = id;
}

static void release_retry(struct tiers *t)
{
	uint32_t n = t->n_unreleased;

	t->n_unreleased = 0;
	for (uint32_t i = 0; i < n; i++)
		release(t, t->unreleased[i]);
}

/* ------------------------------------------------------------ requests */

static void item_finish(struct tiers *t, uint32_t slot, uint32_t i, uint32_t ticket, bool ok,
			uint32_t result, uint64_t hash, uint64_t loc)
{
	struct kva__fetch_area *fa = &t->a->fetch[slot];
	struct kva__fitem *it = &fa->item[i];
	uint32_t busy = kva__f_word(KVA__F_BUSY, ticket);

	atomic_store_explicit(&it->result, result, memory_order_relaxed);
	if (ok) {
		/* what the worker checks the bytes against, and where they are */
		atomic_store_explicit(&it->data_hash, hash, memory_order_relaxed);
		atomic_store_explicit(&it->loc, loc, memory_order_relaxed);
	}
	/* release: our writes into the block and our drop before the worker's
	 * acquire load of DONE */
	atomic_compare_exchange_strong_explicit(
		&it->state, &busy, kva__f_word(ok ? KVA__F_DONE : KVA__F_FAILED, ticket),
		memory_order_release, memory_order_relaxed);
	if (!ok)
		t->fetch_failed++;
	t->wake |= 1ull << slot; /* woken once for all it got this round */
}

/*
 * wake - every slot whose requests finished: its done count bumped, and its
 * waiters woken, once (a 32-block fetch is one wakeup, not 32). Dekker with
 * a waiter, which bumps waiting, then reads done.
 */
static void wake(struct tiers *t)
{
	while (t->wake) {
		uint32_t s = (uint32_t)__builtin_ctzll(t->wake);
		struct kva__fetch_area *fa = &t->a->fetch[s];

		t->wake &= t->wake - 1;
		atomic_fetch_add(&fa->done, 1);
		if (atomic_load(&fa->waiting))
			syscall(SYS_futex, &fa->done, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	}
}

static void latency(struct tiers *t, int k, uint64_t posted)
{
	uint64_t now = now_ns();

	/* the worker's clock reading: believed only if it is plausible */
	if (posted && posted <= now && now - posted < 3600000000000ull)
		hist_add(&t->t[k], now - posted);
}

/* a request's record: valid, the generation it names, the key it names */
static bool rec_is(struct tiers *t, int k, uint32_t i, uint32_t gen, const uint64_t key[2])
{
	struct tier *tr = &t->t[k];

	return tr->on && i < tr->n && tr->rec[i].state == R_VALID && tr->rec[i].gen == gen &&
	       tr->rec[i].key[0] == key[0] && tr->rec[i].key[1] == key[1];
}

static struct disk_op *op_get(struct tiers *t)
{
	struct disk *d = &t->disk;
	uint32_t i = d->free_op;

	if (i == UINT32_MAX)
		return NULL;
	d->free_op = d->ops[i].next_free;
	d->inflight++;
	return &d->ops[i];
}

static void op_put(struct tiers *t, struct disk_op *op)
{
	struct disk *d = &t->disk;

	op->kind = 0;
	op->next_free = d->free_op;
	d->free_op = (uint32_t)(op - d->ops);
	d->inflight--;
}

static uint8_t *op_hdr(struct tiers *t, const struct disk_op *op)
{
	return t->disk.staging + (uint64_t)(op - t->disk.ops) * TIER_HDR_BYTES;
}

static uint8_t *op_rec(struct tiers *t, const struct disk_op *op)
{
	return t->disk.staging + (uint64_t)t->disk.qd * TIER_HDR_BYTES +
	       (uint64_t)(op - t->disk.ops) * t->disk.record_bytes;
}

static uint8_t *pad_scratch(struct tiers *t)
{
	return t->disk.staging + t->disk.staging_bytes - TIER_ALIGN;
}

static struct io_uring_sqe *sqe_get(struct tiers *t)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->disk.ring);

	if (!sqe) { /* the SQ is twice the ops: only if submissions lag */
		io_uring_submit(&t->disk.ring);
		sqe = io_uring_get_sqe(&t->disk.ring);
	}
	return sqe;
}

/* start reading disk record @i into block @dest for request (@slot, @item) */
static void fetch_disk(struct tiers *t, struct disk_op *op, uint32_t i)
{
	struct disk *d = &t->disk;
	const struct kva_arena_info *info = t->info;
	struct io_uring_sqe *sqe = sqe_get(t);
	uint64_t off = d->data_off + (uint64_t)i * d->record_bytes;

	op->kind = OP_FETCH;
	op->rec = i;
	op->expect = d->record_bytes;
	op->staged = d->staged_reads;
	t->t[DISK].rec[i].users++;
	if (op->staged) {
		io_uring_prep_read_fixed(sqe, 0, op_rec(t, op), (unsigned)d->record_bytes, off,
					 (int)d->host_regs);
	} else {
		struct kva__piece p[1];
		uint64_t data = 0, padded = round_up(info->layout.block_bytes, TIER_ALIGN);
		uint32_t n = 0;

		op->iov[n++] = (struct iovec){ op_hdr(t, op), TIER_HDR_BYTES };
		if (info->layout.block_stride) {
			/* the record's padding lands in the block's own */
			kva__rec_pieces(info, op->dest, p);
			op->iov[n++] = (struct iovec){ t->a->data + p[0].off, padded };
			data = padded;
		} else {
			uint32_t np = kva__rec_pieces(info, op->dest, t->pieces);

			for (uint32_t k = 0; k < np; k++) {
				op->iov[n++] = (struct iovec){ t->a->data + t->pieces[k].off,
							       t->pieces[k].len };
				data += t->pieces[k].len;
			}
			if (padded > data)
				op->iov[n++] = (struct iovec){ pad_scratch(t), padded - data };
		}
		op->niov = n;
		io_uring_prep_readv(sqe, 0, op->iov, n, off);
	}
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, (uint64_t)(op - d->ops) + 1);
}

/*
 * put_failed - a GPU arena's block could not be filled from record @r of
 * tier @k (-1: the record is no longer named; nothing to drop): its bytes
 * did not hash to its header (-EBADMSG: the record is dropped), or the
 * device copy failed (-EIO). The block is let go of and the request fails.
 */
static void put_failed(struct tiers *t, int k, uint32_t r, uint32_t dest, uint32_t slot,
		       uint32_t item, uint32_t ticket, int err)
{
	if (err == -EBADMSG && k >= 0) {
		t->t[k].verify_failed++;
		tier_log(TLOG_ERR, "%s tier: record %u did not verify (its data's checksum): "
			 "dropped, a miss", k == HOST ? "host" : "disk", r);
		drop(t, k, r);
	} else if (err != -EBADMSG) {
		t->dev_errors++;
		tier_log(TLOG_ERR, "fetch: the GPU copy into block %u failed: %s", dest,
			 kva_errmsg());
	}
	t->view_now = true;
	release(t, dest);
	item_finish(t, slot, item, ticket, false, err == -EBADMSG ? KVA__FR_VERIFY : KVA__FR_IO, 0,
		    0);
}

/*
 * serve - one request, taken (BUSY with @ticket) from slot @slot's item @i,
 * finished here (DONE or FAILED) or handed to a disk read. The caller made
 * sure of a free disk operation for a disk location; a request forwarded to
 * disk when none is free goes back to POSTED.
 */
static void serve(struct tiers *t, uint32_t slot, uint32_t i, uint32_t ticket)
{
	struct kva__fitem *it = &t->a->fetch[slot].item[i];
	uint64_t key[2] = { atomic_load_explicit(&it->key[0], memory_order_relaxed),
			    atomic_load_explicit(&it->key[1], memory_order_relaxed) };
	uint64_t loc = atomic_load_explicit(&it->loc, memory_order_relaxed);
	uint64_t posted = atomic_load_explicit(&it->posted_ns, memory_order_relaxed);
	uint32_t dest = atomic_load_explicit(&it->dest, memory_order_relaxed);
	uint32_t epoch = atomic_load_explicit(&it->dest_epoch, memory_order_relaxed);
	int k = kva__loc_tier(loc) == KVA__LOC_DISK ? DISK : HOST;
	uint32_t r = kva__loc_slot(loc);
	struct tier *tr = &t->t[k];

	t->fetch_requests++;
	if (!kva__loc_ok(loc) || !rec_is(t, k, r, kva__loc_gen(loc), key)) {
		/* moved since the worker looked (down a tier, or its name
		 * renewed): where the index says it is now, if that holds */
		struct kva__found f;
		uint64_t now_at;

		if (kva__index_lookup_spilled(t->a, key, &f) &&
		    (now_at = kva__p_loc(f.ctrl)) != loc && kva__loc_ok(now_at) &&
		    rec_is(t, kva__loc_tier(now_at) == KVA__LOC_DISK ? DISK : HOST,
			   kva__loc_slot(now_at), kva__loc_gen(now_at), key)) {
			loc = now_at;
			k = kva__loc_tier(loc) == KVA__LOC_DISK ? DISK : HOST;
			r = kva__loc_slot(loc);
			tr = &t->t[k];
			t->forwarded++;
		}
	}
	if (!kva__loc_ok(loc) || !rec_is(t, k, r, kva__loc_gen(loc), key)) {
		/* dropped since: and if the index still says so, it stops */
		if (kva__loc_ok(loc) && tr->on)
			tr->stale++;
		if (kva__loc_ok(loc))
			unname(t, key, loc);
		item_finish(t, slot, i, ticket, false, KVA__FR_STALE, 0, 0);
		return;
	}
	if (k == DISK && t->disk.free_op == TIER_NONE) {
		/* forwarded to disk, and no operation free: back to the queue */
		uint32_t busy = kva__f_word(KVA__F_BUSY, ticket);

		atomic_compare_exchange_strong(&t->a->fetch[slot].item[i].state, &busy,
					       kva__f_word(KVA__F_POSTED, ticket));
		atomic_fetch_or(&t->a->pool->fetch_pending, 1ull << slot);
		t->fetch_blocked = true;
		t->fetch_requests--;
		return;
	}
	if (!kva__hold_dest(t->self, dest, epoch, slot)) {
		item_finish(t, slot, i, ticket, false, KVA__FR_DEST, 0, 0);
		return;
	}
	/* held: its meta is the requester's last word on it, and must name
	 * this very request (a late one of an earlier life names another) */
	{
		const struct kva__bmeta *m = &t->a->bmeta[dest];

		if (atomic_load_explicit(&m->backing, memory_order_relaxed) !=
			    kva__fetch_tag(slot, ticket) ||
		    atomic_load_explicit(&m->key[0], memory_order_relaxed) != key[0] ||
		    atomic_load_explicit(&m->key[1], memory_order_relaxed) != key[1]) {
			release(t, dest);
			item_finish(t, slot, i, ticket, false, KVA__FR_DEST, 0, 0);
			return;
		}
	}
	if (k == HOST) {
		const uint8_t *src = t->host.base + (uint64_t)r * tr->record_bytes;
		struct kva__rec_hdr h;
		const char *why;

		/* ours to write, and nobody else's: no seqlock needed here. The
		 * worker hashes what it gets against the header's hash. */
		memcpy(&h, src, sizeof(h));
		if ((why = kva__rec_hdr_check(&h, t->fp, key, t->info->layout.block_bytes))) {
			tr->verify_failed++;
			t->view_now = true;
			tier_log(TLOG_ERR, "host tier: record %u did not verify (%s): dropped", r, why);
			drop(t, HOST, r);
			release(t, dest);
			item_finish(t, slot, i, ticket, false, KVA__FR_VERIFY, 0, 0);
			return;
		}
		if (t->q) {
			int err = kva__rec_put_dev(t->a, t->q, dest, src + TIER_HDR_BYTES,
						   h.data_hash);

			if (err < 0) {
				put_failed(t, HOST, r, dest, slot, i, ticket, err);
				return;
			}
		} else {
			kva__rec_put(t->a, dest, src + TIER_HDR_BYTES);
		}
		tr->rec[r].ref = 1;
		tr->hits++;
		tr->bytes_out += t->info->layout.block_bytes;
		release(t, dest);
		item_finish(t, slot, i, ticket, true, KVA__FR_OK | KVA__LOC_HOST << 8, h.data_hash,
			    loc);
		return;
	}
	{
		struct disk_op *op = op_get(t); /* the caller made sure of one */

		op->slot = slot;
		op->item = i;
		op->ticket = ticket;
		op->dest = dest;
		op->key[0] = key[0];
		op->key[1] = key[1];
		op->posted_ns = posted;
		op->loc = loc;
		fetch_disk(t, op, r);
	}
}

/* requests of every slot whose pending bit is set (every slot, now and then) */
static bool serve_requests(struct tiers *t, bool sweep)
{
	struct kva_arena *a = t->a;
	uint64_t pend = atomic_exchange(&a->pool->fetch_pending, 0);
	uint32_t served = 0, first = t->serve_from++ % a->max_workers;
	bool any = false;

	t->fetch_blocked = false;
	if (sweep)
		pend |= (a->max_workers < 64 ? (1ull << a->max_workers) : 0) - 1;
	/* from another slot each round: one busy worker cannot keep the
	 * budget from the others */
	for (uint32_t k = 0; k < a->max_workers && pend; k++) {
		uint32_t s = (first + k) % a->max_workers;
		struct kva__fetch_area *fa = &a->fetch[s];

		if (!(pend & (1ull << s)))
			continue;
		pend &= ~(1ull << s);
		if (s == t->self->slot_id)
			continue;
		for (uint32_t i = 0; i < KVA__FETCH_ITEMS; i++) {
			uint32_t st = atomic_load_explicit(&fa->item[i].state, memory_order_relaxed);
			uint64_t loc;

			if (kva__f_kind(st) != KVA__F_POSTED)
				continue;
			loc = atomic_load_explicit(&fa->item[i].loc, memory_order_relaxed);
			/* a disk read needs an operation; a round copies a bounded
			 * number from the host tier: the rest next round */
			if (kva__loc_tier(loc) == KVA__LOC_DISK && t->t[DISK].on &&
			    t->disk.free_op == UINT32_MAX) {
				/* when an operation completes: the ring wakes us */
				t->fetch_blocked = true;
				atomic_fetch_or(&a->pool->fetch_pending, 1ull << s);
				break;
			}
			if (served >= SERVE_BUDGET) {
				atomic_fetch_or(&a->pool->fetch_pending, 1ull << s);
				break;
			}
			/* acquire: the fields the worker wrote before POSTED */
			if (!atomic_compare_exchange_strong_explicit(
				    &fa->item[i].state, &st,
				    kva__f_word(KVA__F_BUSY, kva__f_ticket(st)),
				    memory_order_acquire, memory_order_relaxed))
				continue;
			serve(t, s, i, kva__f_ticket(st));
			served++;
			any = true;
		}
	}
	return any;
}

/* ------------------------------------------------------------ backing */

static bool disk_writable(struct tiers *t)
{
	struct tier *tr = &t->t[DISK];

	if (!tr->on)
		return false;
	if (!tr->degraded)
		return true;
	/* degraded: one write to try now and then, which says if it is back */
	return now_ns() >= tr->retry_at && !t->probe_inflight;
}

/*
 * host_take - the host record the next copy goes into; TIER_NONE: none now.
 *
 * With a disk tier the host tier is a ring: copies go in at head, and are
 * written to disk in order from flush (host_flush). The record at head is
 * the oldest: clean (on disk too), its names move to its disk copy and it is
 * reused; not written yet (the ring is full of unwritten records), it waits
 * for the flush, or is dropped if the disk takes nothing. Without a disk
 * tier: the free list, refilled by demote() from the clock.
 */
static uint32_t host_take(struct tiers *t)
{
	struct tier *ht = &t->t[HOST];
	struct tier_rec *r;
	uint32_t i;

	if (!ht->ring)
		return free_pop(ht);
	i = ht->head;
	r = &ht->rec[i];
	if (r->users)
		return TIER_NONE; /* being written to disk */
	if (ht->dirty == ht->n) {
		/* everything is waiting for the disk */
		if (disk_writable(t))
			return TIER_NONE;
		ht->dropped++;
		drop(t, HOST, i);
		ht->flush = (ht->flush + 1) % ht->n;
		ht->dirty--;
	} else if (r->state == R_VALID && r->other != TIER_NONE &&
		   t->t[DISK].rec[r->other].state == R_VALID) {
		/* clean: from now on its disk copy is the copy */
		rename_loc(t, r->key, rec_loc(t, HOST, i), rec_loc(t, DISK, r->other));
		t->t[DISK].rec[r->other].other = TIER_NONE;
		r->other = TIER_NONE;
		ht->used--;
		rec_free(t, HOST, i);
	} else if (r->state == R_VALID || r->state == R_DEAD) {
		/* its disk copy was overwritten, or never made (a failed write) */
		if (r->state == R_VALID)
			ht->dropped++;
		drop(t, HOST, i);
	}
	ht->head = (i + 1) % ht->n;
	ht->dirty++; /* the caller fills it: not on disk yet */
	return i;
}

/* a copy of block @id, held, in a host record; false: no record free */
static bool back_one(struct tiers *t, uint32_t id)
{
	struct kva_arena *a = t->a;
	struct tier *tr = &t->t[HOST];
	uint64_t epoch, key[2], cur, hash;
	uint32_t i;
	uint8_t *dst;
	struct kva__rec_hdr h, *hp;
	int err;

	if (!kva__hold_published(t->self, id, &epoch)) {
		t->back_skipped++; /* evicted (or never published) before we came */
		return true;
	}
	key[0] = atomic_load_explicit(&a->bmeta[id].key[0], memory_order_relaxed);
	key[1] = atomic_load_explicit(&a->bmeta[id].key[1], memory_order_relaxed);
	cur = atomic_load_explicit(&a->bmeta[id].backing, memory_order_relaxed);
	/* the key the index finds this block under, not only what its meta
	 * says: a copy is made only of what a match would be served */
	{
		struct kva__found f;

		if (!kva__index_lookup(a, key, &f, NULL) || kva__p_block(f.ctrl) != id ||
		    kva__p_epoch(f.ctrl) != epoch) {
			release(t, id);
			t->back_skipped++;
			return true;
		}
	}
	if (kva__loc_ok(cur) &&
	    rec_is(t, kva__loc_tier(cur) == KVA__LOC_DISK ? DISK : HOST, kva__loc_slot(cur),
		   kva__loc_gen(cur), key)) {
		release(t, id);
		return true; /* a copy already */
	}
	i = host_take(t);
	if (i == TIER_NONE) {
		release(t, id);
		return false;
	}
	dst = t->host.base + (uint64_t)i * tr->record_bytes;
	/* the record's seqlock (arena_pvt.h): workers copy from it unlocked */
	hp = (struct kva__rec_hdr *)dst;
	atomic_store_explicit(&hp->magic, 0, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	if (!t->q) {
		hash = kva__rec_gather(a, id, dst + TIER_HDR_BYTES);
	} else if ((err = kva__rec_gather_dev(a, t->q, id, dst + TIER_HDR_BYTES, &hash)) < 0) {
		/* no copy: the record stays free (its magic is 0), the block
		 * is evicted without one if it comes to that */
		t->dev_errors++;
		t->view_now = true;
		tier_log(TLOG_ERR, "host tier: the GPU copy of block %u failed: %s", id,
			 kva_errmsg());
		rec_free(t, HOST, i);
		release(t, id);
		t->back_skipped++;
		return true;
	}
	kva__rec_hdr_fill(&h, t->fp, key, t->info->layout.block_bytes, hash, ++t->seq);
	memcpy(dst + sizeof(hp->magic), (const uint8_t *)&h + sizeof(h.magic),
	       sizeof(h) - sizeof(h.magic));
	atomic_store_explicit(&hp->magic, KVA__REC_MAGIC, memory_order_release);
	tr->rec[i] = (struct tier_rec){ .key = { key[0], key[1] }, .seq = h.seq,
					.gen = tr->rec[i].gen, .state = R_VALID,
					.other = TIER_NONE };
	tr->used++;
	tr->records_in++;
	tr->bytes_in += t->info->layout.block_bytes;
	/* the record is whole: now the block may name it (our release, when
	 * we let go, orders it before any evictor's acquire) */
	atomic_store_explicit(&a->bmeta[id].backing, rec_loc(t, HOST, i), memory_order_relaxed);
	release(t, id);
	t->backed++;
	return true;
}

static void remark(struct kva_arena *a, uint32_t word, uint64_t bits)
{
	atomic_fetch_or(&a->dirty[word], bits);
	atomic_fetch_or(&a->dsum[word / 64], 1ull << (word % 64));
}

/*
 * back_dirty - published blocks marked for a copy, within a round's budget,
 * from the eviction hand on: the blocks evictors look at next are the ones
 * to have a copy first (with a burst of publications, the order decides
 * which blocks lose the race with eviction).
 */
static bool back_dirty(struct tiers *t, bool *stalled)
{
	struct kva_arena *a = t->a;
	uint64_t budget = BACK_BUDGET;
	uint32_t l0 = a->l0_words;
	uint32_t from = atomic_load_explicit(&a->pool->hand, memory_order_relaxed) % a->blocks / 64;
	bool any = false;

	*stalled = false;
	for (uint32_t k = 0; k < l0;) {
		uint32_t word = (from + k) % l0, sw = word / 64;
		uint64_t sum = atomic_load_explicit(&a->dsum[sw], memory_order_relaxed), bits;
		uint64_t bit = 1ull << (word % 64);

		if (!sum) { /* the rest of this summary word: nothing */
			uint32_t skip = 64 - word % 64;

			k += skip < l0 - word ? skip : l0 - word;
			continue;
		}
		k++;
		if (!(sum & bit))
			continue;
		/* the summary bit first, then the word: a bit set after our
		 * read of the word has set the summary bit again (spill_mark) */
		atomic_fetch_and(&a->dsum[sw], ~bit);
		bits = atomic_exchange(&a->dirty[word], 0);
		while (bits) {
			uint32_t id = word * 64 + (uint32_t)__builtin_ctzll(bits);

			if (id >= a->blocks)
				break;
			if (!budget || !back_one(t, id)) {
				/* out of budget, or of host records (demote first):
				 * what is left, for the next round */
				*stalled = budget != 0;
				remark(a, word, bits);
				return any;
			}
			bits &= bits - 1;
			budget = budget > t->t[HOST].record_bytes ? budget - t->t[HOST].record_bytes : 0;
			any = true;
		}
	}
	return any;
}

static bool dirty_pending(const struct tiers *t)
{
	for (uint32_t sw = 0; sw < t->a->l1_words; sw++)
		if (atomic_load_explicit(&t->a->dsum[sw], memory_order_relaxed))
			return true;
	return false;
}

/* ------------------------------------------------------------ demotion */

/*
 * disk_run - up to *@len disk records from the log's head, contiguous, to
 * write a run into: the oldest records on disk, dropped (their names go).
 * Not past the file's end, nor over a record being read or written, nor,
 * while a warm restart scans, over the earlier run's records. Returns the
 * first and sets *@len; TIER_NONE if none is free now.
 */
static uint32_t disk_run(struct tiers *t, uint32_t *len)
{
	struct tier *dt = &t->t[DISK];
	uint32_t i0 = dt->head, k, max = *len < dt->n - i0 ? *len : dt->n - i0;

	for (k = 0; k < max; k++) {
		struct tier_rec *r = &dt->rec[i0 + k];

		if (r->users || r->state == R_WRITING || r->state == R_DEAD ||
		    (t->warming && i0 + k < t->disk.old_records))
			break;
	}
	if (!k)
		return TIER_NONE;
	for (uint32_t j = i0; j < i0 + k; j++) {
		if (dt->rec[j].state == R_VALID) {
			dt->dropped++;
			drop(t, DISK, j);
		}
		dt->rec[j].state = R_WRITING;
	}
	dt->head = (i0 + k) % dt->n;
	*len = k;
	return i0;
}

#define FLUSH_MAX_BYTES (1u << 20) /* one write: at most this, */
#define FLUSH_MIN 8u               /* at least this many records unless idle */

/*
 * host_flush - write the host ring's unwritten records to disk, in order,
 * in runs of up to 1 MiB: one WRITE_FIXED from the registered host memory
 * to the next records of the disk log, sequential on the device. A record
 * stays readable in the host tier while it is written and after (clean);
 * its names move to the disk copy only when the ring reuses it.
 * @force: write what there is (idle, or a copy is waiting for room).
 */
static bool host_flush(struct tiers *t, bool force)
{
	struct tier *ht = &t->t[HOST], *dt = &t->t[DISK];
	struct disk *d = &t->disk;
	uint32_t per_reg = (uint32_t)(d->regs[0].iov_len / d->record_bytes);
	uint32_t max = (uint32_t)(FLUSH_MAX_BYTES / d->record_bytes);
	bool any = false;

	if (!max)
		max = 1;
	while (ht->dirty && d->free_op != TIER_NONE && disk_writable(t) &&
	       (force || ht->dirty >= FLUSH_MIN)) {
		uint32_t h0 = ht->flush, len = ht->dirty < max ? ht->dirty : max, d0;
		struct disk_op *op;
		struct io_uring_sqe *sqe;

		/* one registered buffer, no wrap of the ring */
		if (len > ht->n - h0)
			len = ht->n - h0;
		if (len > per_reg - h0 % per_reg)
			len = per_reg - h0 % per_reg;
		if ((d0 = disk_run(t, &len)) == TIER_NONE)
			break;
		op = op_get(t);
		op->kind = OP_DEMOTE;
		op->host_rec = h0;
		op->rec = d0;
		op->nrec = len;
		op->expect = (uint64_t)len * d->record_bytes;
		for (uint32_t k = 0; k < len; k++) {
			ht->rec[h0 + k].users++;
			dt->rec[d0 + k].other = h0 + k;
		}
		if (dt->degraded)
			t->probe_inflight = true; /* this write says whether we are back */
		t->demoting += len;
		ht->flush = (h0 + len) % ht->n;
		ht->dirty -= len;
		sqe = sqe_get(t);
		io_uring_prep_write_fixed(sqe, 0, t->host.base + (uint64_t)h0 * d->record_bytes,
					  (unsigned)op->expect,
					  d->data_off + (uint64_t)d0 * d->record_bytes,
					  (int)(h0 / per_reg));
		sqe->flags |= IOSQE_FIXED_FILE;
		if (!d->direct && d->dontcache)
			sqe->rw_flags = RWF_DONTCACHE;
		io_uring_sqe_set_data64(sqe, (uint64_t)(op - d->ops) + 1);
		any = true;
		force = true; /* the rest of what was asked for */
	}
	return any;
}

/*
 * demote - without a disk tier: keep a sixteenth of the host records free,
 * dropping the coldest (clock), so that copies never wait.
 */
static bool demote(struct tiers *t)
{
	struct tier *ht = &t->t[HOST];
	uint32_t want = ht->n / 16 ? ht->n / 16 : 1;
	bool any = false;

	while (free_count(ht) < want) {
		uint32_t h = victim(ht);

		if (h == TIER_NONE)
			break;
		ht->dropped++;
		drop(t, HOST, h);
		any = true;
	}
	return any;
}

/* ------------------------------------------------------------ warm restart */

static bool scan(struct tiers *t)
{
	struct disk *d = &t->disk;
	bool any = false;

	while (t->scan_next < d->old_records && d->free_op != UINT32_MAX) {
		struct disk_op *op = op_get(t);
		struct io_uring_sqe *sqe = sqe_get(t);

		op->kind = OP_SCAN;
		op->rec = (uint32_t)t->scan_next++;
		op->expect = TIER_HDR_BYTES;
		io_uring_prep_read_fixed(sqe, 0, op_hdr(t, op), TIER_HDR_BYTES,
					 d->data_off + (uint64_t)op->rec * d->record_bytes,
					 (int)d->host_regs);
		sqe->flags |= IOSQE_FIXED_FILE;
		io_uring_sqe_set_data64(sqe, (uint64_t)(op - d->ops) + 1);
		any = true;
	}
	return any;
}

static void scan_done(struct tiers *t, struct disk_op *op, int res)
{
	struct tier *dt = &t->t[DISK];
	struct kva__rec_hdr h;
	uint32_t i = op->rec;
	uint64_t pos, loc;
	int ret;

	memcpy(&h, op_hdr(t, op), sizeof(h));
	t->scan_done++;
	if (res != TIER_HDR_BYTES ||
	    kva__rec_hdr_check(&h, t->fp, NULL, t->info->layout.block_bytes)) {
		if (res < 0 || (res > 0 && res != TIER_HDR_BYTES))
			dt->io_errors++;
		if (atomic_load_explicit(&h.magic, memory_order_relaxed) == KVA__REC_MAGIC)
			t->restart_dropped++; /* a record, torn or of something else */
		rec_free(t, DISK, i);
	} else {
		dt->rec[i] = (struct tier_rec){ .key = { h.key[0], h.key[1] }, .seq = h.seq,
						.gen = dt->rec[i].gen, .state = R_VALID,
						.other = TIER_NONE };
		if (h.seq > t->seq)
			t->seq = h.seq;
		if (h.seq >= t->scan_last_seq) {
			t->scan_last_seq = h.seq;
			t->scan_last_slot = i;
		}
		loc = rec_loc(t, DISK, i);
		ret = kva__index_insert_spilled(
			t->self, h.key, loc,
			atomic_load_explicit(&t->a->pool->evictions, memory_order_relaxed), &pos);
		if (ret == -EEXIST) {
			/* two records of one key (written, dropped, written again):
			 * the newer stays */
			struct kva__found f;
			uint64_t other;

			if (kva__index_lookup_spilled(t->a, h.key, &f) &&
			    kva__loc_tier(other = kva__p_loc(f.ctrl)) == KVA__LOC_DISK &&
			    kva__loc_slot(other) < dt->n &&
			    dt->rec[kva__loc_slot(other)].state == R_VALID &&
			    dt->rec[kva__loc_slot(other)].seq < h.seq &&
			    kva__index_respill(t->a, f.pos, f.ctrl, loc)) {
				dt->used--;
				rec_free(t, DISK, kva__loc_slot(other));
				t->restart_found--;
				t->restart_dropped++;
				ret = 0;
			}
		}
		if (ret == 0) {
			dt->used++;
			t->restart_found++;
		} else {
			t->restart_dropped++;
			rec_free(t, DISK, i);
		}
	}
	if (t->scan_done >= t->disk.old_records) {
		t->warming = false;
		/* the log goes on after the newest record of the earlier run */
		if (t->restart_found)
			dt->head = (t->scan_last_slot + 1) % dt->n;
		tier_log(TLOG_INFO, "disk tier: warm restart: %llu records of the earlier run found "
			 "and indexed again, %llu dropped (torn, duplicate or of no use)",
			 (unsigned long long)t->restart_found, (unsigned long long)t->restart_dropped);
	}
}

/* ------------------------------------------------------------ completions */

static int inject(struct tiers *t, const struct disk_op *op, int res)
{
	struct disk *d = &t->disk;
	bool w = op->kind == OP_DEMOTE;
	int eio = w ? INJ_WRITE_EIO : INJ_READ_EIO, sh = w ? INJ_WRITE_SHORT : INJ_READ_SHORT;

	if (!d->inj.any || op->kind == OP_SCAN)
		return res;
	d->ops_done[eio]++;
	d->ops_done[sh]++;
	if (w)
		d->ops_done[INJ_WRITE_ENOSPC]++;
	if (d->inj.from[eio] && d->ops_done[eio] >= d->inj.from[eio])
		return -EIO;
	if (w && d->inj.from[INJ_WRITE_ENOSPC] &&
	    d->ops_done[INJ_WRITE_ENOSPC] >= d->inj.from[INJ_WRITE_ENOSPC])
		return -ENOSPC;
	if (d->inj.from[sh] && d->ops_done[sh] >= d->inj.from[sh] && res > 512)
		return res - 512;
	return res;
}

/* a run written to disk (or not): the disk records hold the host records' bytes */
static void flush_done(struct tiers *t, struct disk_op *op, int res)
{
	struct tier *ht = &t->t[HOST], *dt = &t->t[DISK];
	bool ok = res >= 0 && (uint64_t)res == op->expect;

	t->probe_inflight = false;
	t->demoting -= op->nrec;
	if (!ok) {
		struct statvfs vfs;

		if (res < 0)
			degrade(t, DISK, "write of records %u..%u: %s", op->rec, op->rec + op->nrec - 1,
				strerror(-res));
		else if (fstatvfs(t->disk.fd, &vfs) == 0 &&
			 (uint64_t)vfs.f_bavail * vfs.f_frsize < op->expect)
			/* a short write where space ran out: the kernel's way of ENOSPC */
			degrade(t, DISK, "write of records %u..%u: %s (%d of %llu bytes written)",
				op->rec, op->rec + op->nrec - 1, strerror(ENOSPC), res,
				(unsigned long long)op->expect);
		else
			degrade(t, DISK, "short write of records %u..%u: %d of %llu bytes", op->rec,
				op->rec + op->nrec - 1, res, (unsigned long long)op->expect);
	} else {
		recovered(t, DISK);
	}
	for (uint32_t k = 0; k < op->nrec; k++) {
		uint32_t h = op->host_rec + k, i = op->rec + k;
		struct tier_rec *hr = &ht->rec[h], *dr = &dt->rec[i];

		hr->users--;
		dr->other = TIER_NONE;
		if (ok && hr->state == R_VALID) {
			/* both hold it: the host copy is clean, and serves on */
			*dr = (struct tier_rec){ .key = { hr->key[0], hr->key[1] }, .seq = hr->seq,
						 .gen = dr->gen, .state = R_VALID, .other = h };
			hr->other = i;
			dt->used++;
			dt->records_in++;
			dt->bytes_in += t->info->layout.block_bytes;
		} else {
			/* not written, or nothing worth it: the host record stays
			 * unwritten (the ring drops it when it comes round) */
			rec_free(t, DISK, i);
			if (hr->state == R_DEAD && !hr->users)
				rec_free(t, HOST, h);
		}
	}
}

static void fetch_done(struct tiers *t, struct disk_op *op, int res)
{
	struct tier *dt = &t->t[DISK];
	const struct kva_arena_info *info = t->info;
	struct kva__rec_hdr h;
	const char *why = NULL;

	if (!--dt->rec[op->rec].users && dt->rec[op->rec].state == R_DEAD)
		rec_free(t, DISK, op->rec);
	if (res < 0 || (uint64_t)res != op->expect) {
		if (res < 0)
			degrade(t, DISK, "read of record %u: %s", op->rec, strerror(-res));
		else
			degrade(t, DISK, "short read of record %u: %d of %llu bytes", op->rec, res,
				(unsigned long long)op->expect);
		release(t, op->dest);
		item_finish(t, op->slot, op->item, op->ticket, false, KVA__FR_IO, 0, 0);
		return;
	}
	memcpy(&h, op->staged ? op_rec(t, op) : op_hdr(t, op), sizeof(h));
	why = kva__rec_hdr_check(&h, t->fp, op->key, info->layout.block_bytes);
	if (why) {
		/* never served: the block is let go of, the record dropped */
		dt->verify_failed++;
		t->view_now = true;
		tier_log(TLOG_ERR, "disk tier: record %u did not verify (%s): dropped, a miss",
			 op->rec, why);
		if (rec_is(t, DISK, op->rec, kva__loc_gen(op->loc), op->key))
			drop(t, DISK, op->rec);
		release(t, op->dest);
		item_finish(t, op->slot, op->item, op->ticket, false, KVA__FR_VERIFY, 0, 0);
		return;
	}
	if (op->staged && t->q) {
		int err = kva__rec_put_dev(t->a, t->q, op->dest, op_rec(t, op) + TIER_HDR_BYTES,
					   h.data_hash);

		if (err < 0) {
			bool named = rec_is(t, DISK, op->rec, kva__loc_gen(op->loc), op->key);

			put_failed(t, named ? DISK : -1, op->rec, op->dest, op->slot, op->item,
				   op->ticket, err);
			return;
		}
	} else if (op->staged) {
		kva__rec_put(t->a, op->dest, op_rec(t, op) + TIER_HDR_BYTES);
	}
	dt->rec[op->rec].ref = 1;
	dt->hits++;
	dt->bytes_out += info->layout.block_bytes;
	latency(t, DISK, op->posted_ns);
	release(t, op->dest);
	/* the worker hashes the bytes against the header's hash before it
	 * uses them (and reports a mismatch: reject()) */
	item_finish(t, op->slot, op->item, op->ticket, true, KVA__FR_OK | KVA__LOC_DISK << 8,
		    h.data_hash, op->loc);
}

/*
 * rejects - records workers found corrupt (their bytes do not hash to their
 * header): dropped, if the location still names the record it named then.
 * A worker's word: at worst it costs a record (a peer can do worse to the
 * arena itself), never wrong data.
 */
static void rejects(struct tiers *t)
{
	for (uint32_t s = 0; s < t->a->max_workers; s++)
		for (uint32_t k = 0; k < KVA__REJECTS; k++) {
			_Atomic uint64_t *w = &t->a->fetch[s].reject[k];
			uint64_t loc;
			int tk;
			uint32_t i;

			if (!atomic_load_explicit(w, memory_order_relaxed))
				continue;
			loc = atomic_exchange_explicit(w, 0, memory_order_relaxed);
			if (!kva__loc_ok(loc))
				continue;
			tk = kva__loc_tier(loc) == KVA__LOC_DISK ? DISK : HOST;
			i = kva__loc_slot(loc);
			if (!t->t[tk].on || i >= t->t[tk].n || t->t[tk].rec[i].state != R_VALID ||
			    t->t[tk].rec[i].gen != kva__loc_gen(loc))
				continue;
			t->t[tk].verify_failed++;
			t->view_now = true;
			tier_log(TLOG_ERR, "%s tier: record %u did not verify (its data's checksum, "
				 "found by worker slot %u): dropped", tk ? "disk" : "host", i, s);
			drop(t, tk, i);
		}
}

static bool reap(struct tiers *t)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	if (!t->disk.ring_ok)
		return false;
	io_uring_for_each_cqe(&t->disk.ring, head, cqe) {
		uint64_t ud = io_uring_cqe_get_data64(cqe);
		struct disk_op *op;
		int res = cqe->res;

		n++;
		if (!ud || ud > t->disk.qd)
			continue;
		op = &t->disk.ops[ud - 1];
		res = inject(t, op, res);
		switch (op->kind) {
		case OP_DEMOTE:
			flush_done(t, op, res);
			break;
		case OP_FETCH:
			fetch_done(t, op, res);
			break;
		case OP_SCAN:
			scan_done(t, op, res);
			break;
		}
		op_put(t, op);
	}
	io_uring_cq_advance(&t->disk.ring, n);
	return n > 0;
}

/* ------------------------------------------------------------ the view */

static void str_words(_Atomic uint64_t *w, size_t words, const char *s)
{
	char buf[256] = { 0 };
	size_t n = strnlen(s, words * 8 - 1);

	memcpy(buf, s, n);
	for (size_t i = 0; i < words; i++) {
		uint64_t v;

		memcpy(&v, buf + 8 * i, 8);
		atomic_store_explicit(&w[i], v, memory_order_relaxed);
	}
}

static void view(struct tiers *t)
{
	struct kva__tier_view *v = &t->a->pool->tier_view;
	uint64_t now = now_ns();

	for (int k = 0; k < KVA_TIERS; k++) {
		struct tier *tr = &t->t[k];
		struct kva__tier_view_one *o = &v->t[k];
		uint64_t flags = 0, vals[KVA__TV_N] = { 0 };

		if (!tr->on) {
			for (int j = 0; j < KVA__TV_N; j++)
				atomic_store_explicit(&o->v[j], 0, memory_order_relaxed);
			continue;
		}
		flags = KVA__TVF_ENABLED | (tr->degraded ? KVA__TVF_DEGRADED : 0);
		if (k == HOST)
			flags |= t->host.hugetlb ? KVA__TVF_HUGETLB : 0;
		else
			flags |= (t->disk.direct ? KVA__TVF_DIRECT : 0) |
				 (t->disk.prealloc ? KVA__TVF_PREALLOC : 0) |
				 (t->warming ? KVA__TVF_WARMING : 0);
		vals[KVA__TV_FLAGS] = flags;
		vals[KVA__TV_CAP_RECORDS] = tr->n;
		vals[KVA__TV_USED_RECORDS] = tr->used;
		vals[KVA__TV_RECORD_BYTES] = tr->record_bytes;
		vals[KVA__TV_HITS] = tr->hits;
		vals[KVA__TV_BYTES_IN] = tr->bytes_in;
		vals[KVA__TV_BYTES_OUT] = tr->bytes_out;
		vals[KVA__TV_RECORDS_IN] = tr->records_in;
		vals[KVA__TV_P50_NS] = hist_quantile(tr->hist, KVA__HIST_N, 0.5);
		vals[KVA__TV_P99_NS] = hist_quantile(tr->hist, KVA__HIST_N, 0.99);
		vals[KVA__TV_IO_ERRORS] = tr->io_errors;
		vals[KVA__TV_VERIFY_FAILED] = tr->verify_failed;
		vals[KVA__TV_STALE] = tr->stale;
		vals[KVA__TV_DROPPED] = tr->dropped;
		vals[KVA__TV_NODE_QD] = k == HOST ? (uint32_t)t->host.node : t->disk.qd;
		if (k == DISK) {
			vals[KVA__TV_RESTART_FOUND] = t->restart_found;
			vals[KVA__TV_RESTART_DROPPED] = t->restart_dropped;
			vals[KVA__TV_SCAN_DONE] = t->scan_done;
			vals[KVA__TV_SCAN_TOTAL] = t->disk.old_records;
		}
		vals[KVA__TV_DEGRADED_MS] = tr->degraded ? (now - tr->degraded_since) / 1000000 : 0;
		for (int j = 0; j < KVA__TV_N; j++)
			atomic_store_explicit(&o->v[j], vals[j], memory_order_relaxed);
		str_words(o->reason, 12, tr->reason);
		str_words(o->path, 16, k == DISK ? t->disk.path : "");
	}
	atomic_store_explicit(&v->v[KVA__TVS_BACKED], t->backed, memory_order_relaxed);
	atomic_store_explicit(&v->v[KVA__TVS_BACK_SKIPPED], t->back_skipped, memory_order_relaxed);
	atomic_store_explicit(&v->v[KVA__TVS_FETCH_REQUESTS], t->fetch_requests,
			      memory_order_relaxed);
	atomic_store_explicit(&v->v[KVA__TVS_FETCH_FAILED], t->fetch_failed, memory_order_relaxed);
	atomic_store_explicit(&v->v[KVA__TVS_DOORBELLS], t->doorbells, memory_order_relaxed);
}

/*
 * counters - the few counts that move with every copy and write, at the
 * end of any round that did work: a tool waiting for its copies to be made
 * sees them when they are, not at the next whole view.
 */
static void counters(struct tiers *t)
{
	struct kva__tier_view *v = &t->a->pool->tier_view;

	atomic_store_explicit(&v->v[KVA__TVS_BACKED], t->backed, memory_order_relaxed);
	atomic_store_explicit(&v->v[KVA__TVS_BACK_SKIPPED], t->back_skipped, memory_order_relaxed);
	for (int k = 0; k < KVA_TIERS; k++) {
		if (!t->t[k].on)
			continue;
		atomic_store_explicit(&v->t[k].v[KVA__TV_USED_RECORDS], t->t[k].used,
				      memory_order_relaxed);
		atomic_store_explicit(&v->t[k].v[KVA__TV_RECORDS_IN], t->t[k].records_in,
				      memory_order_relaxed);
		atomic_store_explicit(&v->t[k].v[KVA__TV_BYTES_IN], t->t[k].bytes_in,
				      memory_order_relaxed);
	}
}

/* ------------------------------------------------------------ the thread */

static void drain_fd(int fd)
{
	uint64_t v;

	while (fd >= 0 && read(fd, &v, sizeof(v)) == sizeof(v))
		;
}

/* sleep until a doorbell, a completion or the timer; @stalled: the
 * publications waiting are not a reason to stay up (they wait for a
 * demotion's completion) */
static void sleep_now(struct tiers *t, bool stalled)
{
	struct kva__pool *p = t->a->pool;
	struct epoll_event ev[4];
	int n;

	/* Dekker with the workers: they set their bit, then read sleeping.
	 * Requests that wait for a disk operation, and copies that wait for a
	 * flush, are no reason to stay up: a completion wakes us. */
	atomic_store(&p->sleeping, 1);
	atomic_thread_fence(memory_order_seq_cst); /* before dirty_pending()'s relaxed loads */
	if ((atomic_load(&p->fetch_pending) && !t->fetch_blocked) ||
	    (!stalled && dirty_pending(t))) {
		atomic_store(&p->sleeping, 0);
		return;
	}
	n = epoll_wait(t->ep, ev, 4, IDLE_MS);
	atomic_store(&p->sleeping, 0);
	for (int i = 0; i < n; i++)
		if (ev[i].data.fd == t->doorbell)
			t->doorbells++;
	drain_fd(t->doorbell);
	drain_fd(t->disk.ring_efd);
	drain_fd(t->tfd);
}

/* requests nobody will serve any more fail, so their waiters return */
static void fail_posted(struct tiers *t)
{
	struct kva_arena *a = t->a;

	for (uint32_t s = 0; s < a->max_workers; s++)
		for (uint32_t i = 0; i < KVA__FETCH_ITEMS; i++) {
			struct kva__fitem *it = &a->fetch[s].item[i];
			uint32_t st = atomic_load(&it->state);

			if (kva__f_kind(st) == KVA__F_POSTED &&
			    atomic_compare_exchange_strong(&it->state, &st,
							   kva__f_word(KVA__F_BUSY, kva__f_ticket(st))))
				item_finish(t, s, i, kva__f_ticket(st), false, KVA__FR_DEGRADED, 0, 0);
		}
}

static void *run(void *arg)
{
	struct tiers *t = arg;
	uint64_t last_sweep = 0;

	/*
	 * Ahead of the workers on a busy machine: a copy made late is a block
	 * lost to eviction, and what this thread does is bounded by what the
	 * workers publish and fetch. Nice -10 where the agent may (root,
	 * CAP_SYS_NICE, or a unit's LimitNICE=); said once where it may not.
	 */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), TIER_NICE) < 0)
		tier_log(TLOG_INFO, "the tier thread runs at the agent's priority (nice %d: %s): on "
			 "a machine the workers keep busy it may fall behind them",
			 TIER_NICE, strerror(errno));
	while (!atomic_load_explicit(&t->stop, memory_order_relaxed)) {
		uint64_t now = now_ns();
		bool work = false, stalled = false, sweep = now - last_sweep > IDLE_MS * 1000000ull;

		if (sweep) {
			last_sweep = now;
			rejects(t);
		}
		work |= reap(t);
		work |= serve_requests(t, sweep);
		wake(t);
		work |= back_dirty(t, &stalled);
		if (t->t[HOST].ring)
			/* full runs as they come; what is left when nothing else is
			 * to be done, or a copy waits for room */
			work |= host_flush(t, stalled);
		else
			work |= demote(t);
		if (t->warming)
			work |= scan(t);
		if (!work && t->t[HOST].ring && t->t[HOST].dirty)
			work |= host_flush(t, true);
		if (t->disk.ring_ok && io_uring_sq_ready(&t->disk.ring))
			io_uring_submit(&t->disk.ring);
		if (t->n_unreleased)
			release_retry(t);
		if (now - t->last_view >= VIEW_NS || t->view_now) {
			t->last_view = now;
			t->view_now = false;
			view(t);
		} else if (work) {
			counters(t);
		}
		if (!work)
			sleep_now(t, stalled);
	}
	/* what is in flight finishes, then nothing more is served */
	while (t->disk.ring_ok && t->disk.inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(&t->disk.ring, &cqe) < 0)
			break;
		reap(t);
	}
	atomic_store(&t->a->pool->tiers, 0);
	fail_posted(t);
	wake(t);
	release_retry(t);
	view(t);
	return NULL;
}

static int tier_init(struct tier *tr, uint64_t n, uint64_t record_bytes, bool ring)
{
	tr->on = true;
	tr->ring = ring;
	tr->n = (uint32_t)n;
	tr->record_bytes = record_bytes;
	tr->rec = calloc(n ? n : 1, sizeof(*tr->rec));
	if (!tr->rec)
		return -ENOMEM;
	tr->free_head = TIER_NONE;
	for (uint64_t i = n; i-- > 0;) {
		tr->rec[i].other = TIER_NONE;
		/* the free list in order, the lowest first (a ring needs none) */
		tr->rec[i].next_free = tr->free_head;
		tr->free_head = ring ? TIER_NONE : (uint32_t)i;
	}
	return 0;
}

/*
 * A GPU arena: the host memory the copies go to and from pinned (a pinned
 * buffer is copied by the GPU's DMA engines directly; pageable memory goes
 * through a staging copy in the driver), and a stream of the tier thread's.
 */
static int gpu_start(struct tiers *t, char *err, size_t errlen)
{
	int ret;

	if ((ret = kva__dev_host_register(t->a->dev, t->host.base, t->host.bytes)) < 0) {
		snprintf(err, errlen, "host tier: pinning %.1f MiB for the GPU's copies: %s",
			 (double)t->host.bytes / (1 << 20), kva_errmsg());
		return ret;
	}
	t->host_pinned = true;
	if (t->disk.staging) {
		if ((ret = kva__dev_host_register(t->a->dev, t->disk.staging,
						  t->disk.staging_bytes)) < 0) {
			snprintf(err, errlen, "disk tier: pinning its staging for the GPU's copies: "
				 "%s", kva_errmsg());
			return ret;
		}
		t->staging_pinned = true;
	}
	if ((ret = kva__dev_queue_open(t->a->dev, &t->q)) < 0) {
		snprintf(err, errlen, "tiers: a stream for the GPU's copies: %s", kva_errmsg());
		return ret;
	}
	return 0;
}

int tiers_start(const struct tier_config *c, struct kva_arena *a, struct kva_worker *self,
		struct tiers **out, char *err, size_t errlen)
{
	struct tiers *t = calloc(1, sizeof(*t));
	uint64_t rec, host_bytes;
	struct itimerspec its = { { 0, IDLE_MS * 1000000L }, { 0, IDLE_MS * 1000000L } };
	struct epoll_event ev = { .events = EPOLLIN };
	int ret;

	if (!t)
		return -ENOMEM;
	t->cfg = *c;
	t->a = a;
	t->self = self;
	t->info = kva_arena_info(a);
	t->fp = kva__rec_fingerprint(t->info);
	t->doorbell = t->ep = t->tfd = -1;
	t->disk.fd = t->disk.ring_efd = -1;
	t->pieces_max = kva__rec_pieces_max(t->info);
	t->pieces = calloc(t->pieces_max, sizeof(*t->pieces));
	if (!t->pieces) {
		free(t);
		return -ENOMEM;
	}
	rec = tiers_record_bytes(t->info->layout.block_bytes);
	host_bytes = host_bytes_of(c, rec);
	if (host_bytes < rec) {
		snprintf(err, errlen, "host tier: --host-bytes %llu holds no record of %llu bytes",
			 (unsigned long long)host_bytes, (unsigned long long)rec);
		ret = -EINVAL;
		goto fail;
	}
	if ((ret = host_mem_create(&t->host, host_bytes, c->host_node, c->host_hugepages, err,
				   errlen)) < 0)
		goto fail;
	/* the records --host-bytes holds, not the mapping's: on huge pages the
	 * memory is rounded up to 2 MiB, and the tier would hold more than
	 * asked (and than tiers_keys() counted keys for) */
	if ((ret = tier_init(&t->t[HOST], host_bytes / rec, rec, c->disk_dir[0] != 0)) < 0)
		goto fail;
	if (c->disk_dir[0]) {
		t->disk.qd = c->queue_depth ? c->queue_depth : 64;
		if ((ret = disk_open(&t->disk, c, t->info, t->fp, err, errlen)) < 0 ||
		    (ret = disk_ring(&t->disk, &t->host, t->info, err, errlen)) < 0)
			goto fail;
		if ((ret = tier_init(&t->t[DISK], t->disk.records, rec, true)) < 0)
			goto fail;
		t->warming = t->disk.old_records > 0;
		/* the log starts past the earlier run's records (the file grew),
		 * or waits for their scan */
		t->t[DISK].head = t->disk.old_records < t->disk.records ? (uint32_t)t->disk.old_records
									: 0;
		if (t->disk.inj.any)
			tier_log(TLOG_WARN, "TEST FAULT INJECTION ACTIVE (KVA_TIER_INJECT=%s): the "
				 "disk tier fails on purpose", c->inject);
	}
	if (a->dev && (ret = gpu_start(t, err, errlen)) < 0)
		goto fail;
	t->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	t->ep = epoll_create1(EPOLL_CLOEXEC);
	t->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (t->doorbell < 0 || t->ep < 0 || t->tfd < 0 || timerfd_settime(t->tfd, 0, &its, NULL) < 0) {
		ret = -errno;
		snprintf(err, errlen, "tiers: the event loop: %s", strerror(errno));
		goto fail;
	}
	ev.data.fd = t->doorbell;
	epoll_ctl(t->ep, EPOLL_CTL_ADD, t->doorbell, &ev);
	ev.data.fd = t->tfd;
	epoll_ctl(t->ep, EPOLL_CTL_ADD, t->tfd, &ev);
	if (t->disk.ring_efd >= 0) {
		ev.data.fd = t->disk.ring_efd;
		epoll_ctl(t->ep, EPOLL_CTL_ADD, t->disk.ring_efd, &ev);
	}
	/* from now on workers mark publications and keep evicted keys' places */
	atomic_store(&a->pool->tiers, KVA__TIERS_HOST | (c->disk_dir[0] ? KVA__TIERS_DISK : 0));
	view(t);
	/* the thread takes no signals: the agent's main thread reads them
	 * from its signalfd */
	{
		sigset_t all, old;

		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		ret = pthread_create(&t->thread, NULL, run, t);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (ret != 0) {
		atomic_store(&a->pool->tiers, 0);
		snprintf(err, errlen, "tiers: a thread: %s", strerror(ret));
		ret = -ret;
		goto fail;
	}
	t->started = true;
	*out = t;
	return 0;
fail:
	tiers_stop(t);
	return ret;
}

int tiers_doorbell(const struct tiers *t)
{
	return t ? t->doorbell : -1;
}

int tiers_host_fd(const struct tiers *t)
{
	return t ? t->host.fd : -1;
}

void tiers_stop(struct tiers *t)
{
	if (!t)
		return;
	if (t->started) {
		uint64_t one = 1;

		atomic_store(&t->stop, true);
		if (write(t->doorbell, &one, sizeof(one)) < 0) {
			/* it wakes within IDLE_MS anyway */
		}
		pthread_join(t->thread, NULL);
	}
	/* the stream drained and closed, the pinning undone, before the
	 * memory it pinned goes */
	kva__dev_queue_close(t->q);
	if (t->staging_pinned)
		kva__dev_host_unregister(t->a->dev, t->disk.staging);
	if (t->host_pinned)
		kva__dev_host_unregister(t->a->dev, t->host.base);
	disk_close(&t->disk);
	host_mem_destroy(&t->host);
	for (int k = 0; k < KVA_TIERS; k++)
		free(t->t[k].rec);
	if (t->doorbell >= 0)
		close(t->doorbell);
	if (t->ep >= 0)
		close(t->ep);
	if (t->tfd >= 0)
		close(t->tfd);
	free(t->unreleased);
	free(t->pieces);
	free(t);
}
