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

/* every cached block out of the arena: allocate all there is, free it */
static void evict_all(struct kva_worker *w)
{
	uint32_t blocks = kva_arena_info(kva_worker_arena(w))->blocks, *ids, n = 0;

	ids = malloc(sizeof(*ids) * blocks);
	assert_non_null(ids);
	while (n < blocks && kva_alloc(w, 1, ids + n) == 0)
		n++;
	assert_int_equal(kva_free(w, ids, n), 0);
	free(ids);
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

/* ------------------------------------------------------------ tests */

/*
 * One worker publishes, the blocks are evicted, another worker's match finds
 * them below and its fetch brings them back, byte for byte: from the host
 * tier, then (past its size) from the disk tier.
 */
static void round_trip(const char *dtype, const char *layout)
{
	char dir[128];
	struct setup s = { .dtype = dtype, .layout = layout, .host_bytes = "2M", .blocks = "64" };
	struct tu_agent ag;
	struct kva_worker *a, *b;
	struct got g;

	/* host only: 16 blocks published, evicted, back from the host tier */
	start(&ag, &s);
	a = attach(&ag, "publisher");
	b = attach(&ag, "fetcher");
	publish_doc(a, 1, 16);
	wait_backed(&ag, 16);
	evict_all(a);
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
		evict_all(a);
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
			evict_all(b);
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

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip_every_dtype_and_layout),
	};

	if (argc < 3) {
		fprintf(stderr, "usage: %s AGENT CTL\n", argv[0]);
		return 2;
	}
	agent_path = argv[1];
	ctl_path = argv[2];
	return cmocka_run_group_tests_name("tiers", tests, NULL, NULL);
}
