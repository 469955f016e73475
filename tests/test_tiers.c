/* SPDX-License-Identifier: MIT */
/*
 * test_tiers.c - the tiers below the arena, through the real kvarena-agent
 * and the public API: blocks published by one worker, evicted, found below
 * by another's match and fetched back, byte for byte, from the host tier and
 * from the disk tier; every dtype and both layouts; four processes at once;
 * faults (EIO, short I/O, ENOSPC on a real small file system, a flipped
 * byte in a record, no O_DIRECT, a memlock limit); SIGKILL of workers and of
 * the agent; warm restart of the disk tier.
 *
 * Every block's bytes are derived from its key, so a block served with
 * another's bytes, or with a torn record's, is seen.
 *
 * usage: test_tiers AGENT CTL
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena_pvt.h"
#include "kvarena.h"
#include "testutil.h"

static const char *agent_path, *ctl_path;

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ the agent */

#define MAX_ARGS 30

struct setup {
	const char *dtype, *layout;
	const char *host_bytes;     /* NULL: none */
	const char *disk_dir;       /* NULL: none */
	const char *disk_bytes;
	const char *direct;         /* NULL: auto */
	const char *blocks;         /* default 64 */
	const char *extra[6];
};

static void args_of(const struct setup *s, const char **argv)
{
	unsigned n = 0;

	argv[n++] = "--blocks";
	argv[n++] = s->blocks ? s->blocks : "64";
	argv[n++] = "--worker-cache";
	argv[n++] = "0";
	argv[n++] = "--disk-queue-depth";
	argv[n++] = "8";
	if (s->dtype) {
		argv[n++] = "--dtype";
		argv[n++] = s->dtype;
	}
	if (s->layout) {
		argv[n++] = "--layout";
		argv[n++] = s->layout;
	}
	if (s->host_bytes) {
		argv[n++] = "--host-bytes";
		argv[n++] = s->host_bytes;
	}
	if (s->disk_dir) {
		argv[n++] = "--disk-dir";
		argv[n++] = s->disk_dir;
		argv[n++] = "--disk-bytes";
		argv[n++] = s->disk_bytes ? s->disk_bytes : "4M";
	}
	if (s->direct) {
		argv[n++] = "--disk-direct";
		argv[n++] = s->direct;
	}
	for (unsigned k = 0; k < 6 && s->extra[k]; k++)
		argv[n++] = s->extra[k];
	argv[n] = NULL;
}

static void start_ex(struct tu_agent *ag, const struct setup *s, void (*pre)(void *), void *arg)
{
	const char *argv[MAX_ARGS];
	int ret;

	args_of(s, argv);
	ret = tu_agent_start_ex(ag, agent_path, argv, pre, arg);
	if (ret < 0)
		fail_msg("starting %s: %s (its log: %s)", agent_path, strerror(-ret), ag->log);
}

static void start(struct tu_agent *ag, const struct setup *s)
{
	start_ex(ag, s, NULL, NULL);
}

static void stop(struct tu_agent *ag)
{
	int status = 0;

	assert_int_equal(tu_agent_stop(ag, SIGTERM, 10000, &status), 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static struct kva_arena *observe(const struct tu_agent *ag)
{
	struct kva_arena *a;

	assert_int_equal(kva_observe(ag->socket, &a, NULL), 0);
	return a;
}

static struct kva_tiers_stats tier_stats(const struct tu_agent *ag)
{
	struct kva_arena *a = observe(ag);
	struct kva_tiers_stats st;

	assert_int_equal(kva_arena_tier_stats(a, &st), 0);
	kva_arena_close(a);
	return st;
}

static void check_clean(const struct tu_agent *ag)
{
	struct kva_arena *a = observe(ag);
	struct kva_check_report r;
	int ret = -1;

	/* a worker's reclaim may be in flight for a moment */
	for (int k = 0; k < 100 && (ret = kva_arena_check(a, &r)) < 0; k++)
		sleep_ms(50);
	if (ret < 0)
		fail_msg("arena check: %s", kva_errmsg());
	kva_arena_close(a);
}

/* ------------------------------------------------------------ documents */

/* token i of block j of document d: the same in every process */
static int32_t token_of(uint32_t d, uint32_t j, uint32_t i)
{
	uint64_t x = ((uint64_t)d << 40 | (uint64_t)j << 20 | i) * 0x9e3779b97f4a7c15ull;

	x ^= x >> 31;
	return (int32_t)(x % 100000);
}

static const struct kva_seq_opts seq_opts = { .kind = KVA_OWNER_INFERENCE, .model = "tiers-test" };

/* the tokens and keys of @n blocks of document @d */
static int32_t *doc_tokens(struct kva_worker *w, uint32_t d, uint32_t n, uint64_t (*keys)[2])
{
	uint32_t bt = kva_arena_info(kva_worker_arena(w))->geometry.block_tokens;
	int32_t *tok = malloc(sizeof(*tok) * n * bt);
	uint64_t salt[2];

	assert_non_null(tok);
	for (uint32_t j = 0; j < n; j++)
		for (uint32_t i = 0; i < bt; i++)
			tok[j * bt + i] = token_of(d, j, i);
	kva_prefix_salt(seq_opts.model, seq_opts.adapter, seq_opts.tenant, salt);
	for (uint32_t j = 0; keys && j < n; j++)
		kva_prefix_hash(j ? keys[j - 1] : NULL, salt, tok + j * bt, bt, keys[j]);
	return tok;
}

/* the bytes block @id must carry for @key, every piece of it (K, V, scales) */
static void walk_block(struct kva_worker *w, uint32_t id, const uint64_t key[2], bool write,
		       bool *ok)
{
	const struct kva_arena_info *info = kva_arena_info(kva_worker_arena(w));
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	uint8_t *base = (uint8_t *)kva_block_data(w, 0) - kva_kv_offset(g, l, info->blocks, 0, 0, 0, 0);
	uint64_t s = key[0] ^ (key[1] * 0x9e3779b97f4a7c15ull) ^ 1;

	for (int scales = 0; scales < (l->scale_bytes ? 2 : 1); scales++)
		for (uint32_t layer = 0; layer < g->layers; layer++)
			for (int kv = 0; kv < 2; kv++) {
				uint8_t *p = base + kva_kv_offset(g, l, info->blocks, id, layer, kv,
								  scales);
				uint64_t len = scales ? l->scale_bytes : l->page_bytes;

				for (uint64_t o = 0; o + 8 <= len; o += 8) {
					uint64_t v;

					s ^= s << 13;
					s ^= s >> 7;
					s ^= s << 17;
					if (write) {
						memcpy(p + o, &s, 8);
					} else {
						memcpy(&v, p + o, 8);
						if (v != s)
							*ok = false;
					}
				}
			}
}

static void block_fill(struct kva_worker *w, uint32_t id, const uint64_t key[2])
{
	walk_block(w, id, key, true, NULL);
}

static bool block_check(struct kva_worker *w, uint32_t id, const uint64_t key[2])
{
	bool ok = true;

	walk_block(w, id, key, false, &ok);
	return ok;
}

/* publish @n blocks of document @d (their bytes from their keys), cached at the end */
static void publish_doc(struct kva_worker *w, uint32_t d, uint32_t n)
{
	uint32_t bt = kva_arena_info(kva_worker_arena(w))->geometry.block_tokens;
	uint64_t(*keys)[2] = calloc(n, sizeof(*keys));
	int32_t *tok = doc_tokens(w, d, n, keys);
	struct kva_seq *s;
	const uint32_t *ids;
	size_t nb, nt;

	assert_int_equal(kva_seq_open(w, &seq_opts, &s), 0);
	assert_int_equal(kva_seq_reserve(s, (size_t)n * bt), 0);
	kva_seq_block_table(s, &ids, &nb, &nt);
	for (uint32_t j = 0; j < n; j++)
		block_fill(w, ids[j], keys[j]);
	assert_int_equal(kva_seq_append(s, tok, (size_t)n * bt), 0);
	kva_seq_close(s);
	free(tok);
	free(keys);
}

/* the agent copied @n blocks below (backed) */
static void wait_backed(const struct tu_agent *ag, uint64_t n)
{
	uint64_t t0 = now_ms();

	while (tier_stats(ag).backed < n) {
		if (now_ms() - t0 > 10000)
			fail_msg("the agent backed %llu blocks of %llu in 10 s",
				 (unsigned long long)tier_stats(ag).backed, (unsigned long long)n);
		sleep_ms(10);
	}
}

struct got {
	struct kva_match m;
	struct kva_fetch_result r;
	size_t tokens;       /* the sequence's length at the end */
	uint32_t bad;        /* blocks whose bytes were not their key's */
	int fetch_ret;
};

/* match document @d (@n blocks), fetch what is below, check every byte */
static struct got get_doc(struct kva_worker *w, uint32_t d, uint32_t n, int timeout_ms)
{
	uint32_t bt = kva_arena_info(kva_worker_arena(w))->geometry.block_tokens;
	uint64_t(*keys)[2] = calloc(n, sizeof(*keys));
	int32_t *tok = doc_tokens(w, d, n, keys);
	struct got g = { .fetch_ret = -ENODATA };
	struct kva_seq *s;
	const uint32_t *ids;
	size_t nb, nt;

	assert_int_equal(kva_seq_open(w, &seq_opts, &s), 0);
	assert_int_equal(kva_seq_match_tiers(s, tok, (size_t)n * bt, &g.m), 0);
	g.tokens = g.m.tokens;
	if (g.m.below_tokens) {
		g.fetch_ret = kva_seq_fetch_start(s, 0);
		if (g.fetch_ret == 0) {
			g.fetch_ret = kva_seq_fetch_wait(s, timeout_ms, &g.r);
			if (g.fetch_ret == -ETIMEDOUT)
				assert_int_equal(kva_seq_fetch_cancel(s, &g.r), 0);
			g.tokens = g.r.tokens;
		}
	}
	kva_seq_block_table(s, &ids, &nb, &nt);
	assert_int_equal(nt, g.tokens);
	for (size_t j = 0; j < nt / bt; j++)
		g.bad += !block_check(w, ids[j], keys[j]);
	kva_seq_close(s);
	free(tok);
	free(keys);
	return g;
}

static struct kva_worker *attach(const struct tu_agent *ag, const char *name)
{
	struct kva_worker *w;

	if (kva_attach(ag->socket, name, &w) < 0)
		fail_msg("attach: %s", kva_errmsg());
	return w;
}

/* the agent's log says nothing went wrong that should not have */
static void assert_quiet(const struct tu_agent *ag)
{
	unsigned n = tu_agent_log_count(ag, "repaired:") + tu_agent_log_count(ag, "did not verify") +
		     tu_agent_log_count(ag, "tier degraded");

	if (n)
		fail_msg("the agent's log has %u lines of repairs, failed checks or degraded tiers "
			 "(%s)", n, ag->log);
}

static void rm_rf(const char *dir)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void mkdir_tmp(char *dir, size_t len)
{
	snprintf(dir, len, "/var/tmp/kva-tiers-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

/*
 * serve_doc - a request as an engine makes it: match, fetch what is below
 * (within @timeout_ms, else cancel), check every byte attached, compute and
 * publish the rest. Counts into @st.
 */
struct load {
	_Atomic uint64_t requests, t1_blocks, host_blocks, disk_blocks, failed, bad, errors;
};

static void serve_doc(struct kva_worker *w, uint32_t d, uint32_t n, int timeout_ms,
		      struct load *st)
{
	uint32_t bt = kva_arena_info(kva_worker_arena(w))->geometry.block_tokens;
	uint64_t(*keys)[2] = calloc(n, sizeof(*keys));
	int32_t *tok = doc_tokens(w, d, n, keys);
	struct kva_fetch_result r = { 0 };
	struct kva_match m;
	struct kva_seq *s;
	const uint32_t *ids;
	size_t nb, nt;
	int ret;

	if (kva_seq_open(w, &seq_opts, &s) < 0) {
		st->errors++;
		goto out;
	}
	if (kva_seq_match_tiers(s, tok, (size_t)n * bt, &m) < 0) {
		st->errors++;
		goto close;
	}
	st->t1_blocks += m.tokens / bt;
	if (m.below_tokens && kva_seq_fetch_start(s, 0) == 0) {
		ret = kva_seq_fetch_wait(s, timeout_ms, &r);
		if (ret == -ETIMEDOUT)
			kva_seq_fetch_cancel(s, &r);
		else if (ret < 0)
			st->errors++;
		st->host_blocks += r.host_blocks;
		st->disk_blocks += r.disk_blocks;
		st->failed += r.failed_blocks;
	}
	kva_seq_block_table(s, &ids, &nb, &nt);
	for (size_t j = 0; j < nt / bt; j++)
		if (!block_check(w, ids[j], keys[j]))
			st->bad++;
	/* the rest: computed (its bytes from its keys) and published */
	if (nt < (size_t)n * bt && kva_seq_reserve(s, (size_t)n * bt - nt) == 0) {
		kva_seq_block_table(s, &ids, &nb, &nt);
		for (size_t j = nt / bt; j < n; j++)
			block_fill(w, ids[j], keys[j]);
		if (kva_seq_append(s, tok + nt, (size_t)n * bt - nt) < 0)
			st->errors++;
	}
	st->requests++;
close:
	kva_seq_close(s);
out:
	free(tok);
	free(keys);
}

/* the first record of the tier file at @path holding @key: its offset, or -1 */
static off_t record_of(const char *path, const uint64_t key[2], uint64_t rec_bytes)
{
	int fd = open(path, O_RDONLY);
	uint64_t hdr[6];
	off_t off = -1;

	assert_true(fd >= 0);
	for (off_t o = 4096; pread(fd, hdr, sizeof(hdr), o) == sizeof(hdr); o += (off_t)rec_bytes)
		/* magic, format|hdr_bytes, fingerprint, key[0], key[1] */
		if (hdr[3] == key[0] && hdr[4] == key[1]) {
			off = o;
			break;
		}
	close(fd);
	return off;
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	assert_int_equal(fsync(fd), 0);
	/* out of the page cache too, so the agent's O_DIRECT read sees it */
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

static void tier_file(char *out, size_t len, const char *dir)
{
	snprintf(out, len, "%s/kvarena-kvarena.tier", dir);
}

/* publish @docs documents of @n blocks, each evicted after it is copied */
static void publish_evict(const struct tu_agent *ag, struct kva_worker *w, uint32_t first,
			  uint32_t docs, uint32_t n)
{
	uint64_t before = tier_stats(ag).backed;

	for (uint32_t d = 0; d < docs; d++) {
		publish_doc(w, first + d, n);
		wait_backed(ag, before + (uint64_t)n * (d + 1));
		assert_int_equal(tu_evict_all(w), 0);
	}
}

/* wait until the disk tier holds @n records */
static void wait_disk(const struct tu_agent *ag, uint64_t n)
{
	uint64_t t0 = now_ms();

	while (tier_stats(ag).tier[KVA_TIER_DISK].used_records < n) {
		if (now_ms() - t0 > 10000)
			fail_msg("the disk tier holds %llu records, not %llu, after 10 s",
				 (unsigned long long)tier_stats(ag).tier[KVA_TIER_DISK].used_records,
				 (unsigned long long)n);
		sleep_ms(10);
	}
}

/* mount a file system of @type (@opts) on @dir; false if this machine will not */
static bool mount_fs(const char *dir, const char *type, const char *opts)
{
	if (mount(type, dir, type, 0, opts) == 0)
		return true;
	print_message("      (cannot mount %s on %s: %s: fault injection stands in)\n", type, dir,
		      strerror(errno));
	return false;
}

/* the agent's tier view, until @cond holds of it (2 s at most) */
#define wait_tiers(ag, ts, cond)                                  \
	do {                                                      \
		for (int k_ = 0; k_ < 200; k_++) {                \
			ts = tier_stats(ag);                      \
			if (cond)                                 \
				break;                            \
			sleep_ms(10);                             \
		}                                                 \
	} while (0)

static void unmount(const char *dir)
{
	/* the kernel may still be letting go of the agent's file */
	for (int k = 0; k < 100 && umount(dir) < 0; k++) {
		assert_int_equal(errno, EBUSY);
		sleep_ms(50);
	}
	umount2(dir, MNT_DETACH);
}

static void set_inject(void *arg)
{
	setenv("KVA_TIER_INJECT", arg, 1);
}

/* ------------------------------------------------------------ tests */

/*
 * One worker publishes, the blocks are evicted, another worker's match finds
 * them below and its fetch brings them back, byte for byte: from the host
 * tier, then (past its size) from the disk tier.
 */
static void round_trip(const char *dtype, const char *layout)
{
	char dir[128];
	struct setup s = { .dtype = dtype, .layout = layout, .host_bytes = "2M", .blocks = "64",
			   .disk_bytes = "8M" };
	struct tu_agent ag;
	struct kva_worker *a, *b;
	struct got g;

	/* host only: 16 blocks published, evicted, back from the host tier */
	start(&ag, &s);
	a = attach(&ag, "publisher");
	b = attach(&ag, "fetcher");
	publish_doc(a, 1, 16);
	wait_backed(&ag, 16);
	assert_int_equal(tu_evict_all(a), 0);
	g = get_doc(b, 1, 16, 5000);
	if (g.tokens != 16 * 16 || g.bad || g.r.host_blocks != 16)
		fail_msg("%s %s host: matched %zu + %zu below, fetched %zu tokens (%u host, %u disk, "
			 "%u failed), %u bad", dtype, layout, g.m.tokens, g.m.below_tokens, g.tokens,
			 g.r.host_blocks, g.r.disk_blocks, g.r.failed_blocks, g.bad);
	/* a second time: in the arena now, no fetch */
	g = get_doc(b, 1, 16, 5000);
	assert_int_equal(g.m.tokens, 16 * 16);
	assert_int_equal(g.bad, 0);
	kva_detach(a);
	kva_detach(b);
	check_clean(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);

	/* and the disk: a host tier too small to keep them */
	snprintf(dir, sizeof(dir), "/var/tmp/kva-tiers-XXXXXX");
	assert_non_null(mkdtemp(dir));
	s.host_bytes = "1M";
	s.disk_dir = dir;
	start(&ag, &s);
	a = attach(&ag, "publisher");
	b = attach(&ag, "fetcher");
	for (uint32_t d = 0; d < 8; d++) {
		publish_doc(a, 100 + d, 8);
		wait_backed(&ag, 8 * (d + 1));
		assert_int_equal(tu_evict_all(a), 0);
	}
	{
		uint32_t disk = 0, host = 0;

		for (uint32_t d = 0; d < 8; d++) {
			g = get_doc(b, 100 + d, 8, 5000);
			if (g.tokens != 8 * 16 || g.bad)
				fail_msg("%s %s disk: doc %u: matched %zu + %zu below (%zu disk), fetched "
					 "%zu tokens (%u failed), %u bad", dtype, layout, d, g.m.tokens,
					 g.m.below_tokens, g.m.below_disk_tokens, g.tokens,
					 g.r.failed_blocks, g.bad);
			disk += g.r.disk_blocks;
			host += g.r.host_blocks;
			assert_int_equal(tu_evict_all(b), 0);
		}
		if (!disk)
			fail_msg("%s %s: nothing came from the disk tier (%u from the host)", dtype,
				 layout, host);
	}
	kva_detach(a);
	kva_detach(b);
	check_clean(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	{
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		assert_int_equal(system(cmd), 0);
	}
}

static void test_round_trip_every_dtype_and_layout(void **state)
{
	static const char *const dtypes[] = { "f32", "f16", "bf16", "fp8_e4m3", "int8" };
	static const char *const layouts[] = { "block-major", "layer-major" };

	(void)state;
	for (unsigned d = 0; d < 5; d++)
		for (unsigned l = 0; l < 2; l++)
			round_trip(dtypes[d], layouts[l]);
}


/*
 * Four processes serve requests over shared documents at once: matches in
 * the arena and below, fetches from both tiers, evictions that spill, the
 * host tier demoting to disk under them. Every byte attached is checked.
 */
static void test_four_processes_match_fetch_evict_and_demote(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "96", .disk_bytes = "16M" };
	struct tu_agent ag;
	struct load *st = tu_shared_alloc(sizeof(*st));
	pid_t pids[4];
	struct kva_tiers_stats ts;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	for (int k = 0; k < 4; k++) {
		pids[k] = tu_fork();
		if (pids[k] == 0) {
			struct kva_worker *w;
			uint64_t rng = 0x1234567 + (uint64_t)k, t0 = now_ms();

			if (kva_attach(ag.socket, "load", &w) < 0)
				_exit(3);
			while (now_ms() - t0 < 4000) {
				uint32_t d = (uint32_t)(tu_rand(&rng) % 48);

				serve_doc(w, 1000 + d, 4 + d % 5, 2000, st);
			}
			kva_detach(w);
			_exit(0);
		}
	}
	for (int k = 0; k < 4; k++) {
		int status;

		assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	ts = tier_stats(&ag);
	print_message("      %llu requests: %llu blocks matched in the arena, %llu fetched from "
		      "host, %llu from disk, %llu not; disk holds %llu\n",
		      (unsigned long long)st->requests, (unsigned long long)st->t1_blocks,
		      (unsigned long long)st->host_blocks, (unsigned long long)st->disk_blocks,
		      (unsigned long long)st->failed,
		      (unsigned long long)ts.tier[KVA_TIER_DISK].used_records);
	assert_int_equal(st->bad, 0);
	assert_int_equal(st->errors, 0);
	assert_true(st->host_blocks > 0);
	assert_true(st->disk_blocks > 0);
	assert_true(ts.tier[KVA_TIER_DISK].records_in > 0);
	check_clean(&ag);
	assert_quiet(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
	tu_shared_free(st, sizeof(*st));
}

/*
 * I/O errors and short I/O (injected in the disk tier's completions): the
 * tier says it is degraded (log, stats), what it cannot serve is a miss,
 * the host tier and the arena go on.
 */
static void faulty_disk(const char *inject, bool reads)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "64" };
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_tiers_stats ts;
	struct got g;
	uint32_t served = 0, failed = 0;

	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start_ex(&ag, &s, set_inject, (void *)inject);
	assert_true(tu_agent_log_count(&ag, "TEST FAULT INJECTION ACTIVE") > 0);
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 200, 8, 8);
	for (uint32_t d = 0; d < 8; d++) {
		g = get_doc(w, 200 + d, 8, 5000);
		assert_int_equal(g.bad, 0);
		served += g.r.host_blocks + g.r.disk_blocks;
		failed += g.r.failed_blocks;
		assert_int_equal(tu_evict_all(w), 0);
	}
	/*
	 * Degraded now, or degraded and back already: with reads failing, a
	 * write (a spill of the evictions above) still works, and the tier
	 * retries one a second after its first error (engine.c, RETRY_MIN_NS),
	 * so a run slower than that can find it recovered when it looks (seen
	 * once, in a release run while other builds compiled beside it).
	 */
	wait_tiers(&ag, ts,
		   ts.tier[KVA_TIER_DISK].degraded ||
			   tu_agent_log_count(&ag, "disk tier recovered") > 0);
	if (!ts.tier[KVA_TIER_DISK].io_errors ||
	    (!ts.tier[KVA_TIER_DISK].degraded &&
	     tu_agent_log_count(&ag, "disk tier recovered") == 0))
		fail_msg("%s: the disk tier is not degraded (%llu I/O errors)", inject,
			 (unsigned long long)ts.tier[KVA_TIER_DISK].io_errors);
	assert_true(tu_agent_log_count(&ag, "disk tier degraded") > 0);
	assert_true(served > 0); /* the host tier serves on */
	if (reads)
		assert_true(failed > 0);
	/* and the arena: allocation, publication, matching */
	publish_doc(w, 300, 8);
	g = get_doc(w, 300, 8, 1000);
	assert_int_equal(g.m.tokens, 8 * 16);
	kva_detach(w);
	check_clean(&ag);
	assert_int_equal(tu_agent_log_count(&ag, "repaired:"), 0);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

static void test_io_errors_and_short_io_degrade_the_tier_and_nothing_else(void **state)
{
	(void)state;
	faulty_disk("read-eio:1", true);
	faulty_disk("read-short:1", true);
	faulty_disk("write-eio:3", false);
	faulty_disk("write-short:2", false);
}

/*
 * A full file system, for real: a 1 MiB tmpfs under a 4 MiB disk tier. The
 * preallocation fails and says so; writes fail with ENOSPC past the space;
 * the tier is degraded; the rest goes on.
 */
static void test_a_full_file_system_degrades_the_disk_tier(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "64", .disk_bytes = "4M" };
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_tiers_stats ts;
	bool mounted;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	mounted = mount_fs(dir, "tmpfs", "size=1m");
	s.disk_dir = dir;
	if (mounted)
		start(&ag, &s);
	else
		start_ex(&ag, &s, set_inject, "write-enospc:8");
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 400, 12, 8);
	wait_tiers(&ag, ts, ts.tier[KVA_TIER_DISK].degraded);
	if (mounted) {
		assert_true(tu_agent_log_count(&ag, "preallocating") > 0);
		assert_false(ts.tier[KVA_TIER_DISK].preallocated);
	}
	if (!ts.tier[KVA_TIER_DISK].degraded || !strstr(ts.tier[KVA_TIER_DISK].reason, "space"))
		fail_msg("the disk tier is %s (%s)", ts.tier[KVA_TIER_DISK].degraded ? "degraded"
						     : "not degraded", ts.tier[KVA_TIER_DISK].reason);
	for (uint32_t d = 0; d < 12; d++)
		assert_int_equal(get_doc(w, 400 + d, 8, 5000).bad, 0);
	publish_doc(w, 499, 8);
	assert_int_equal(get_doc(w, 499, 8, 1000).m.tokens, 8 * 16);
	kva_detach(w);
	check_clean(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	if (mounted)
		unmount(dir);
	rm_rf(dir);
}

/*
 * A byte flipped in a record on disk (its data, then another's header): the
 * fetch serves the blocks before it, never that one, and the agent drops it.
 */
static void test_a_flipped_byte_on_disk_is_a_miss_never_served(void **state)
{
	char dir[128], file[192];
	struct setup s = { .host_bytes = "1M", .blocks = "64" };
	struct tu_agent ag;
	struct kva_worker *w;
	uint64_t keys[8][2], rec;
	int32_t *tok;
	struct got g;
	int flipped = -1;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 500, 10, 8);
	wait_disk(&ag, 40);
	rec = tier_stats(&ag).tier[KVA_TIER_DISK].record_bytes;
	tier_file(file, sizeof(file), dir);
	/* the first document with a block on disk: its first such block */
	for (uint32_t d = 0; d < 10 && flipped < 0; d++) {
		tok = doc_tokens(w, 500 + d, 8, keys);
		free(tok);
		for (int j = 1; j < 8 && flipped < 0; j++) {
			off_t off = record_of(file, keys[j], rec);

			if (off < 0)
				continue;
			/* a data byte; the earlier blocks must still be served */
			flip_byte(file, off + 4096 + 1000);
			flipped = j;
			g = get_doc(w, 500 + d, 8, 5000);
			if (g.bad || g.tokens / 16 > (size_t)j)
				fail_msg("doc %u: a record with a flipped byte (block %d) was served: "
					 "%zu tokens, %u bad", d, j, g.tokens, g.bad);
			assert_true(g.r.failed_blocks >= 1);
		}
	}
	assert_true(flipped > 0);
	{
		struct kva_tiers_stats ts;

		wait_tiers(&ag, ts, ts.tier[KVA_TIER_DISK].verify_failed >= 1);
		assert_true(ts.tier[KVA_TIER_DISK].verify_failed >= 1);
	}
	/* the agent drops what the worker reported, and says so */
	for (int k = 0; k < 200 && !tu_agent_log_count(&ag, "did not verify"); k++)
		sleep_ms(10);
	assert_true(tu_agent_log_count(&ag, "did not verify") >= 1);
	kva_detach(w);
	check_clean(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

/*
 * Workers killed (SIGKILL) in the middle of fetches, at every moment from
 * posting to completion: reclaim stays exact, and once the agent is done
 * with what it was writing, no block is held by anyone.
 */
static void test_a_worker_killed_during_a_fetch_loses_nothing(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "64" };
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_arena *obs;
	struct kva_stats st;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	w = attach(&ag, "publisher");
	publish_evict(&ag, w, 600, 6, 8);
	kva_detach(w);
	for (int round = 0; round < 24; round++) {
		pid_t pid = tu_fork();
		int status;

		if (pid == 0) {
			struct kva_worker *v;
			uint64_t keys[8][2];
			int32_t *tok;
			struct kva_seq *q;
			struct kva_match m;

			if (kva_attach(ag.socket, "victim", &v) < 0)
				_exit(3);
			tok = doc_tokens(v, 600 + round % 6, 8, keys);
			if (kva_seq_open(v, &seq_opts, &q) < 0 ||
			    kva_seq_match_tiers(q, tok, 8 * 16, &m) < 0)
				_exit(4);
			if (m.below_tokens && kva_seq_fetch_start(q, 0) < 0)
				_exit(5);
			/* dead before, while or after the agent serves it */
			if (round % 3)
				usleep((useconds_t)(round * 97 % 900));
			raise(SIGKILL);
		}
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	check_clean(&ag);
	/* everything comes back: nobody holds a block */
	obs = observe(&ag);
	for (int k = 0; k < 200; k++) {
		assert_int_equal(kva_arena_stats(obs, &st), 0);
		if (!st.owned_blocks && !st.shared_blocks)
			break;
		sleep_ms(20);
	}
	if (st.owned_blocks || st.shared_blocks)
		fail_msg("%u blocks owned, %u shared with no worker left", st.owned_blocks,
			 st.shared_blocks);
	kva_arena_close(obs);
	assert_int_equal(tu_agent_log_count(&ag, "repaired:"), 0);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

/*
 * The agent killed (SIGKILL) while it demotes, then started again on the
 * same --disk-dir: the disk tier is found, its records checked, and the
 * valid ones are hits again, byte for byte. Then a clean stop and start.
 */
static void test_the_disk_tier_survives_the_agent(void **state)
{
	char dir[128];
	/* room on disk for everything published here: what the restart finds
	 * is all of it that was written */
	struct setup s = { .host_bytes = "1M", .blocks = "64", .disk_bytes = "32M" };
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_tiers_stats ts;
	uint32_t disk = 0;
	pid_t pub;
	int status;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 700, 12, 8);
	wait_disk(&ag, 48);
	kva_detach(w);
	/* more publishing while it is killed: demotions in flight */
	pub = tu_fork();
	if (pub == 0) {
		struct kva_worker *v;

		if (kva_attach(ag.socket, "more", &v) < 0)
			_exit(3);
		for (uint32_t d = 0; d < 40; d++) {
			publish_doc(v, 800 + d, 8);
			assert_int_equal(tu_evict_all(v), 0);
		}
		_exit(0);
	}
	sleep_ms(60);
	assert_int_equal(tu_agent_stop(&ag, SIGKILL, 5000, &status), 0);
	assert_true(WIFSIGNALED(status));
	waitpid(pub, &status, 0);
	tu_agent_cleanup(&ag);

	for (int life = 0; life < 2; life++) {
		start(&ag, &s);
		for (int k = 0; k < 500 && tier_stats(&ag).tier[KVA_TIER_DISK].warming; k++)
			sleep_ms(10);
		ts = tier_stats(&ag);
		print_message("      restart %d: %llu records found again, %llu dropped\n", life,
			      (unsigned long long)ts.tier[KVA_TIER_DISK].restart_found,
			      (unsigned long long)ts.tier[KVA_TIER_DISK].restart_dropped);
		assert_true(ts.tier[KVA_TIER_DISK].restart_found >= 40);
		assert_true(tu_agent_log_count(&ag, "warm restart") > 0);
		w = attach(&ag, "after");
		disk = 0;
		for (uint32_t d = 0; d < 12; d++) {
			struct got g = get_doc(w, 700 + d, 8, 5000);

			assert_int_equal(g.bad, 0);
			disk += g.r.disk_blocks;
			assert_int_equal(tu_evict_all(w), 0);
		}
		if (disk < 40)
			fail_msg("restart %d: %u blocks of the earlier run fetched from disk", life, disk);
		kva_detach(w);
		check_clean(&ag);
		stop(&ag);  /* the second life starts after a clean stop */
		tu_agent_cleanup(&ag);
	}
	rm_rf(dir);
}

/*
 * A file system without O_DIRECT (ramfs): --disk-direct require refuses to
 * start and says why; auto falls back to buffered I/O, says so, and works.
 */
static void test_no_o_direct_is_said_and_handled(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "64", .direct = "require" };
	struct tu_agent ag;
	struct kva_worker *w;
	const char *argv[MAX_ARGS];
	bool mounted;
	int ret;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	mounted = mount_fs(dir, "ramfs", "mode=0700");
	s.disk_dir = dir;
	args_of(&s, argv);
	ret = tu_agent_start_ex(&ag, agent_path, argv, mounted ? NULL : set_inject,
				mounted ? NULL : (void *)"nodirect");
	assert_int_equal(ret, -ECHILD);
	assert_true(tu_agent_log_count(&ag, "does not take O_DIRECT (--disk-direct require)") > 0);
	tu_agent_cleanup(&ag);

	s.direct = "auto";
	if (mounted)
		start(&ag, &s);
	else
		start_ex(&ag, &s, set_inject, "nodirect");
	assert_true(tu_agent_log_count(&ag, "buffered I/O instead") > 0);
	assert_false(tier_stats(&ag).tier[KVA_TIER_DISK].direct);
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 900, 8, 8);
	{
		uint32_t disk = 0;

		for (uint32_t d = 0; d < 8; d++) {
			struct got g = get_doc(w, 900 + d, 8, 5000);

			assert_int_equal(g.bad, 0);
			assert_int_equal(g.tokens, 8 * 16);
			disk += g.r.disk_blocks;
			assert_int_equal(tu_evict_all(w), 0);
		}
		assert_true(disk > 0);
	}
	kva_detach(w);
	check_clean(&ag);
	assert_quiet(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	if (mounted)
		unmount(dir);
	rm_rf(dir);
}

static void low_memlock(void *arg)
{
	struct rlimit rl = { 256 << 10, 256 << 10 };

	(void)arg;
	prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0); /* root keeps no way around it */
	setrlimit(RLIMIT_MEMLOCK, &rl);
}

/* a memlock limit too low for the pinned buffers: refused, naming the limit */
static void test_a_low_memlock_limit_is_refused_by_name(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "8M", .blocks = "64" };
	struct tu_agent ag;
	const char *argv[MAX_ARGS];

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	args_of(&s, argv);
	assert_int_equal(tu_agent_start_ex(&ag, agent_path, argv, low_memlock, NULL), -ECHILD);
	if (!tu_agent_log_count(&ag, "memlock limit is 0.2 MiB"))
		fail_msg("no sentence naming the memlock limit in %s", ag.log);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

/*
 * --host-bytes bounds what the host tier holds, on any pages: on huge pages
 * its memory is rounded up to whole 2 MiB pages, and the records are still
 * the ones the size asked for (huge pages where the system's hugetlb pool
 * has some: scripts/test.sh reserves a few for the release tree).
 */
static void test_host_bytes_bound_the_host_tier_on_any_pages(void **state)
{
	struct setup s = { .host_bytes = "3M", .blocks = "64" };
	struct tu_agent ag;

	(void)state;
	for (int huge = 0; huge < 2; huge++) {
		struct kva_tiers_stats st;
		const struct kva_tier_stats *h = &st.tier[KVA_TIER_HOST];

		s.extra[0] = "--host-hugepages";
		s.extra[1] = huge ? "true" : "false";
		start(&ag, &s);
		st = tier_stats(&ag);
		assert_true(h->enabled);
		assert_true(h->record_bytes > 0);
		if (!huge)
			assert_false(h->hugetlb);
		if (h->capacity_records != (3ull << 20) / h->record_bytes)
			fail_msg("host tier on %s pages: %llu records of %llu bytes for --host-bytes "
				 "3M (%llu fit)", h->hugetlb ? "huge" : "ordinary",
				 (unsigned long long)h->capacity_records,
				 (unsigned long long)h->record_bytes,
				 (unsigned long long)((3ull << 20) / h->record_bytes));
		print_message("      host tier on %s pages: %llu records\n",
			      h->hugetlb ? "huge" : "ordinary",
			      (unsigned long long)h->capacity_records);
		stop(&ag);
		tu_agent_cleanup(&ag);
	}
}

/* kvarena-ctl tiers, as text and as JSON; the map's markers in its legend */
static void test_ctl_shows_the_tiers(void **state)
{
	char dir[128], out[8192];
	struct setup s = { .host_bytes = "1M", .blocks = "64" };
	struct tu_agent ag;
	struct kva_worker *w;
	struct json_object *o, *h, *d, *v;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	w = attach(&ag, "worker");
	publish_evict(&ag, w, 1100, 6, 8);
	wait_disk(&ag, 8);
	assert_int_equal(get_doc(w, 1100, 8, 5000).bad, 0);
	{
		const char *argv[] = { ctl_path, "--socket", ag.socket, "tiers", NULL };

		assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "host  ok"));
		assert_non_null(strstr(out, "disk  ok"));
		assert_non_null(strstr(out, "O_DIRECT I/O"));
	}
	{
		const char *argv[] = { ctl_path, "--socket", ag.socket, "--json", "tiers", NULL };

		assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
		o = json_tokener_parse(out);
		assert_non_null(o);
		assert_true(json_object_object_get_ex(o, "host", &h));
		assert_true(json_object_object_get_ex(o, "disk", &d));
		assert_true(json_object_object_get_ex(h, "enabled", &v) && json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(d, "direct", &v) && json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(d, "records_in", &v) && json_object_get_int64(v) > 0);
		assert_true(json_object_object_get_ex(h, "hits", &v) || true);
		assert_true(json_object_object_get_ex(o, "fetched", &v) && json_object_get_int64(v) >= 8);
		assert_true(json_object_object_get_ex(h, "fetch_p99_us", &v));
		assert_true(json_object_object_get_ex(o, "spilled_disk", &v) &&
			    json_object_get_int64(v) > 0);
		json_object_put(o);
	}
	{
		const char *argv[] = { ctl_path, "--socket", ag.socket, "--json", "map", NULL };

		assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "\"v\":"));
		assert_non_null(strstr(out, "\"^\":"));
	}
	kva_detach(w);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

/*
 * The tier words a worker can write, scribbled by an attached worker for two
 * seconds (every slot's fetch requests POSTED with random blocks, epochs,
 * keys and locations; the pending bits; the dirty bitmap and its summary;
 * blocks' backings; reject lists; the doorbell rung) while another worker
 * matches and fetches. The agent never serves a byte that is not its key's,
 * never crashes or spins, and afterwards serves a new prefix whole, and the
 * arena checks clean.
 */
static void test_scribbled_tier_words_fool_nobody(void **state)
{
	char dir[128];
	struct setup s = { .host_bytes = "1M", .blocks = "64", .disk_bytes = "8M" };
	struct tu_agent ag;
	struct kva_worker *w;
	pid_t scrib;
	int status;
	uint32_t bad = 0, served = 0;
	uint64_t t0;

	(void)state;
	mkdir_tmp(dir, sizeof(dir));
	s.disk_dir = dir;
	start(&ag, &s);
	w = attach(&ag, "good");
	publish_evict(&ag, w, 900, 12, 8);
	scrib = tu_fork();
	if (scrib == 0) {
		struct kva_worker *v;
		struct kva_arena *a;
		uint64_t seed = 77, one = 1;
		uint64_t end;

		if (kva_attach(ag.socket, "scribbler", &v) < 0)
			_exit(3);
		a = kva_worker_arena(v);
		end = now_ms() + 2000;
		while (now_ms() < end) {
			for (uint32_t k = 0; k < 64; k++) {
				uint32_t sl = (uint32_t)(tu_rand(&seed) % a->max_workers);
				struct kva__fetch_area *fa = &a->fetch[sl];
				struct kva__fitem *it = &fa->item[tu_rand(&seed) % KVA__FETCH_ITEMS];
				uint64_t r = tu_rand(&seed);

				atomic_store(&it->dest, (uint32_t)(r % 3 ? r % a->blocks : r));
				atomic_store(&it->dest_epoch, (uint32_t)tu_rand(&seed));
				atomic_store(&it->key[0], tu_rand(&seed));
				atomic_store(&it->key[1], tu_rand(&seed));
				atomic_store(&it->loc, r % 2 ? kva__loc_make((uint32_t)(r >> 8) % 3,
									    (uint32_t)(r >> 16),
									    (uint32_t)(r >> 32) % 1024)
							     : tu_rand(&seed));
				atomic_store(&it->state, kva__f_word(KVA__F_POSTED, (uint32_t)(r >> 40)));
				atomic_store(&fa->reject[r % KVA__REJECTS], r % 5 ? 0 : tu_rand(&seed));
				atomic_store(&fa->reject_next, (uint32_t)tu_rand(&seed));
				atomic_store(&a->dirty[r % a->l0_words], tu_rand(&seed));
				atomic_store(&a->dsum[r % a->l1_words], tu_rand(&seed));
				atomic_store(&a->bmeta[r % a->blocks].backing, tu_rand(&seed));
			}
			atomic_store(&a->pool->fetch_pending, ~0ull);
			if (v->doorbell >= 0 && write(v->doorbell, &one, sizeof(one)) < 0)
				_exit(4);
			sleep_ms(1);
		}
		_exit(0);
	}
	t0 = now_ms();
	while (now_ms() - t0 < 2000) {
		for (uint32_t d = 0; d < 12; d++) {
			struct got g = get_doc(w, 900 + d, 8, 2000);

			bad += g.bad;
			served += g.r.host_blocks + g.r.disk_blocks;
			assert_int_equal(tu_evict_all(w), 0);
		}
	}
	assert_int_equal(waitpid(scrib, &status, 0), scrib);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(bad, 0);
	assert_int_equal(kill(ag.pid, 0), 0);
	print_message("      during the scribbles: %u blocks fetched, none wrong\n", served);
	/* afterwards: a new prefix goes down and comes back whole */
	sleep_ms(300);
	publish_evict(&ag, w, 950, 1, 8);
	{
		struct got g = get_doc(w, 950, 8, 5000);

		if (g.tokens != 8 * 16 || g.bad)
			fail_msg("after the scribbles: %zu tokens of 128 (%u host, %u disk, %u failed), "
				 "%u bad", g.tokens, g.r.host_blocks, g.r.disk_blocks,
				 g.r.failed_blocks, g.bad);
	}
	kva_detach(w);
	check_clean(&ag);
	stop(&ag);
	tu_agent_cleanup(&ag);
	rm_rf(dir);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip_every_dtype_and_layout),
		cmocka_unit_test(test_four_processes_match_fetch_evict_and_demote),
		cmocka_unit_test(test_io_errors_and_short_io_degrade_the_tier_and_nothing_else),
		cmocka_unit_test(test_a_full_file_system_degrades_the_disk_tier),
		cmocka_unit_test(test_a_flipped_byte_on_disk_is_a_miss_never_served),
		cmocka_unit_test(test_a_worker_killed_during_a_fetch_loses_nothing),
		cmocka_unit_test(test_the_disk_tier_survives_the_agent),
		cmocka_unit_test(test_no_o_direct_is_said_and_handled),
		cmocka_unit_test(test_a_low_memlock_limit_is_refused_by_name),
		cmocka_unit_test(test_host_bytes_bound_the_host_tier_on_any_pages),
		cmocka_unit_test(test_ctl_shows_the_tiers),
		cmocka_unit_test(test_scribbled_tier_words_fool_nobody),
	};

	if (argc < 3) {
		fprintf(stderr, "usage: %s AGENT CTL\n", argv[0]);
		return 2;
	}
	agent_path = argv[1];
	ctl_path = argv[2];
	return cmocka_run_group_tests_name("tiers", tests, NULL, NULL);
}
