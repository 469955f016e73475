/* SPDX-License-Identifier: MIT */
/*
 * gpu_worker.c - one worker process of a GPU arena, for test_gpu_arena: a
 * program of its own (exec'd, not forked) so that each worker is a fresh
 * process that loads the driver itself and leaves through exit(), where the
 * driver stand-in checks that nothing was left reserved, mapped or
 * unreleased (KVA_CUDASTUB_STRICT). Block bytes go through kva_block_read
 * and kva_block_write, and the K/V through the kernels: the CPU kernels on
 * the stand-in's host-backed pointers, the CUDA kernels on a real device.
 *
 * usage: gpu_worker SOCKET COMMAND [ARGS]
 *   share I N       publish prefix I (K/V stored with the kernels), then
 *                   match the prefixes of workers 0..N-1 but I, as they
 *                   come, and check every value of them, and a decode over
 *                   them against a decode of a host copy
 *   hold N          take N blocks, stamp them, say "held" and wait to be killed
 *   attach [K]      attach and detach K times (default 1), a block written
 *                   and read back each time; print the last attach's parts
 *                   as JSON
 *   fork            a sequence with a partial block forked and appended to:
 *                   the partial block copied on the device
 *   outlive         attach, say "attached", wait for a line on stdin (the
 *                   agent is stopped meanwhile), check the blocks still
 *                   read and the agent is seen gone, detach
 * Exit: 0 done; 1 a check failed (said on stderr); 3 kva_attach failed (its
 * errno and message on stdout: "attach: -5 cuda: ...").
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_pvt.h"
#include "kvarena.h"

#define PREFIX_BLOCKS 4
#define STAND_IN "kvarena CUDA driver stand-in"

static struct kva_worker *w;
static const struct kva_arena_info *info;
static int real_gpu; /* the kernels run on the device, not the CPU */

#define FAIL(...)                                                   \
	do {                                                        \
		fprintf(stderr, "gpu_worker %d: ", (int)getpid()); \
		fprintf(stderr, __VA_ARGS__);                       \
		fprintf(stderr, "\n");                              \
		exit(1);                                            \
	} while (0)

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static int attach(const char *sock, const char *name)
{
	int ret = kva_attach(sock, name, &w);

	if (ret < 0) {
		printf("attach: %d %s\n", ret, kva_errmsg());
		fflush(stdout);
		exit(3);
	}
	info = kva_arena_info(kva_worker_arena(w));
	if (info->backend != KVA_BACKEND_CUDA)
		FAIL("the arena is not on a GPU");
	real_gpu = strncmp(info->device_name, STAND_IN, strlen(STAND_IN)) != 0;
	return 0;
}

/* token t of prefix @p, the same in every process */
static int32_t token_of(uint32_t p, uint32_t t)
{
	return (int32_t)((p * 7919u + t * 104729u) % 50000u);
}

/* the value of K (kv 0) or V (kv 1) for token @t of prefix @p: exact in f32 */
static float value_of(uint32_t p, uint32_t t, uint32_t layer, int kv, uint32_t head, uint32_t d)
{
	return (float)((p * 977u + t * 131u + d * 7u + head * 1009u + layer * 4099u +
			(uint32_t)kv * 65537u) % 8191u) / 64.0f;
}

static const struct kva_seq_opts seq_opts = { .kind = KVA_OWNER_INFERENCE, .model = "gpu" };

/* @n tokens' K and V of prefix @p, for one layer: [n][heads][dim] */
static void kv_of(uint32_t p, uint32_t layer, size_t n, float *k, float *v)
{
	const struct kva_geometry *g = &info->geometry;

	for (size_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < g->kv_heads; h++)
			for (uint32_t d = 0; d < g->head_dim; d++) {
				size_t i = (t * g->kv_heads + h) * g->head_dim + d;

				k[i] = value_of(p, (uint32_t)t, layer, 0, h, d);
				v[i] = value_of(p, (uint32_t)t, layer, 1, h, d);
			}
}

/* device buffers of @bytes holding @src (a real GPU's kernels read only those) */
static void *on_device(const void *src, size_t bytes)
{
	void *p;

	if (kva__cuda_malloc(&p, bytes) < 0 || kva__cuda_copy(p, src, bytes, 1) < 0)
		FAIL("device buffer: %s", kva_errmsg());
	return p;
}

/* store @n tokens of prefix @p into the blocks @ids with the kernels */
static void store(uint32_t p, const uint32_t *ids, size_t n)
{
	const struct kva_geometry *g = &info->geometry;
	size_t per = (size_t)g->kv_heads * g->head_dim;
	float *k = malloc(sizeof(float) * n * per), *v = malloc(sizeof(float) * n * per);
	int64_t *slots = malloc(sizeof(int64_t) * n);

	if (!k || !v || !slots)
		FAIL("out of memory");
	for (size_t t = 0; t < n; t++)
		slots[t] = (int64_t)ids[t / g->block_tokens] * g->block_tokens +
			   (int64_t)(t % g->block_tokens);
	for (uint32_t layer = 0; layer < g->layers; layer++) {
		struct kva_kv_desc kv;
		int ret;

		kv_of(p, layer, n, k, v);
		if (kva_kv_desc_for_arena(kva_worker_arena(w), layer, &kv) < 0)
			FAIL("kv_desc: %s", kva_errmsg());
		if (!real_gpu) {
			ret = kva_store_kv(&kv, k, v, KVA_F32, slots, (int32_t)n);
		} else {
			void *dk = on_device(k, sizeof(float) * n * per);
			void *dv = on_device(v, sizeof(float) * n * per);
			void *ds = on_device(slots, sizeof(int64_t) * n);
			uint32_t errors = 0;

			ret = kva_store_kv_cuda(&kv, dk, dv, KVA_F32, ds, (int32_t)n, NULL);
			if (ret == 0)
				ret = kva_cuda_take_errors(&errors);
			if (errors)
				FAIL("store on the device: errors %#x", errors);
			kva__cuda_free(dk);
			kva__cuda_free(dv);
			kva__cuda_free(ds);
		}
		if (ret < 0)
			FAIL("store layer %u: %s", layer, kva_errmsg());
	}
	free(k);
	free(v);
	free(slots);
}

/* every value of blocks @ids (prefix @p's tokens, in order) as stored */
static void check_values(uint32_t p, const uint32_t *ids, size_t nblocks)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	float *b = malloc(l->block_bytes);

	if (!b)
		FAIL("out of memory");
	for (size_t j = 0; j < nblocks; j++) {
		/* the contents in canonical order: per layer, K page then V page,
		 * each [head][token][dim] */
		if (kva_block_read(w, ids[j], 0, b, l->block_bytes) < 0)
			FAIL("block read: %s", kva_errmsg());
		for (uint32_t layer = 0; layer < g->layers; layer++)
			for (int kv = 0; kv < 2; kv++)
				for (uint32_t h = 0; h < g->kv_heads; h++)
					for (uint32_t t = 0; t < g->block_tokens; t++)
						for (uint32_t d = 0; d < g->head_dim; d++) {
							size_t i = (((size_t)(2 * layer + (uint32_t)kv) * g->kv_heads + h) *
									    g->block_tokens + t) * g->head_dim + d;
							float want = value_of(p, (uint32_t)(j * g->block_tokens + t),
									      layer, kv, h, d);

							if (b[i] != want)
								FAIL("prefix %u block %zu (id %u) layer %u %s head %u token "
								     "%u dim %u: %g, not %g", p, j, ids[j], layer,
								     kv ? "V" : "K", h, t, d, b[i], want);
						}
		/* on the stand-in the device pointers are host-backed: the
		 * kernels' own view of the block says the same */
		if (!real_gpu) {
			void *pk, *pv;

			if (kva_block_kv(w, ids[j], 0, &pk, &pv) < 0 || memcmp(pk, b, l->page_bytes))
				FAIL("block %u: kva_block_kv's K page is not what kva_block_read read",
				     ids[j]);
		}
	}
	free(b);
}

/*
 * A decode of one query over blocks @ids in the arena, on the device (a real
 * GPU) or the CPU (the stand-in), against the CPU's decode of a host copy
 * of the same blocks: the arena's kv descriptor addresses the right bytes.
 */
static void check_decode(const uint32_t *ids, size_t nblocks)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	int32_t heads = (int32_t)g->kv_heads * 2, n = (int32_t)nblocks;
	size_t qn = (size_t)heads * g->head_dim;
	float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn);
	float *ref = malloc(sizeof(float) * qn);
	uint8_t *copy = malloc(l->block_bytes * nblocks);
	int32_t indptr[2] = { 0, n }, *idx = malloc(sizeof(int32_t) * nblocks), last = (int32_t)g->block_tokens;
	int32_t *local = malloc(sizeof(int32_t) * nblocks);
	struct kva_page_table pt = { 1, last, indptr, idx, &last };
	struct kva_page_table lpt = { 1, last, indptr, local, &last };
	struct kva_kv_desc kv, hk;
	float scale = 1.0f / sqrtf((float)g->head_dim);

	if (!q || !out || !ref || !copy || !idx || !local)
		FAIL("out of memory");
	for (size_t i = 0; i < qn; i++)
		q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
	for (size_t j = 0; j < nblocks; j++) {
		idx[j] = (int32_t)ids[j];
		local[j] = (int32_t)j;
		if (kva_block_read(w, ids[j], 0, copy + j * l->block_bytes, l->block_bytes) < 0)
			FAIL("block read: %s", kva_errmsg());
	}
	/* layer 1 of the host copy: blocks of the same shape, packed */
	if (kva_kv_desc_for_arena(kva_worker_arena(w), 1, &kv) < 0)
		FAIL("kv_desc: %s", kva_errmsg());
	hk = kv;
	hk.k = copy + (size_t)2 * l->page_bytes;
	hk.v = copy + (size_t)3 * l->page_bytes;
	hk.page_stride = (int64_t)(l->block_bytes / sizeof(float));
	hk.num_pages = n;
	if (kva_decode(&hk, &lpt, q, KVA_F32, heads, scale, ref, NULL, NULL) < 0)
		FAIL("decode of the host copy: %s", kva_errmsg());
	if (!real_gpu) {
		if (kva_decode(&kv, &pt, q, KVA_F32, heads, scale, out, NULL, NULL) < 0)
			FAIL("decode over the arena: %s", kva_errmsg());
	} else {
		void *dq = on_device(q, sizeof(float) * qn), *dp = on_device(indptr, sizeof(indptr));
		void *di = on_device(idx, sizeof(int32_t) * nblocks), *dl = on_device(&last, 4);
		void *dout;
		struct kva_page_table dpt = { 1, last, dp, di, dl };

		if (kva__cuda_malloc(&dout, sizeof(float) * qn) < 0 ||
		    kva_decode_cuda(&kv, &dpt, dq, KVA_F32, heads, scale, dout, NULL, NULL, NULL) < 0 ||
		    kva__cuda_copy(out, dout, sizeof(float) * qn, 0) < 0)
			FAIL("decode on the device: %s", kva_errmsg());
		kva__cuda_free(dq);
		kva__cuda_free(dp);
		kva__cuda_free(di);
		kva__cuda_free(dl);
		kva__cuda_free(dout);
	}
	for (size_t i = 0; i < qn; i++)
		if (fabsf(out[i] - ref[i]) > (real_gpu ? 1e-3f : 0.0f))
			FAIL("decode over the arena's blocks: out[%zu] %g, the host copy's %g", i,
			     out[i], ref[i]);
	free(q);
	free(out);
	free(ref);
	free(copy);
	free(idx);
	free(local);
}

static int32_t *prefix_tokens(uint32_t p, size_t n)
{
	int32_t *t = malloc(sizeof(*t) * n);

	if (!t)
		FAIL("out of memory");
	for (size_t i = 0; i < n; i++)
		t[i] = token_of(p, (uint32_t)i);
	return t;
}

static int cmd_share(uint32_t me, uint32_t count)
{
	size_t n = (size_t)PREFIX_BLOCKS * info->geometry.block_tokens, got = 0, nb, nt;
	int32_t *tok = prefix_tokens(me, n);
	const uint32_t *ids;
	struct kva_seq *s;

	if (kva_seq_open(w, &seq_opts, &s) < 0 || kva_seq_reserve(s, n) < 0)
		FAIL("seq: %s", kva_errmsg());
	kva_seq_block_table(s, &ids, &nb, &nt);
	store(me, ids, n);
	if (kva_seq_append(s, tok, n) < 0)
		FAIL("append: %s", kva_errmsg());
	free(tok);
	/* the others', as they come: published blocks stay cached after
	 * their publisher leaves, so nobody waits for anybody */
	for (uint32_t p = 0; p < count; p++) {
		struct kva_seq *o;
		int tries = 0;

		if (p == me)
			continue;
		tok = prefix_tokens(p, n);
		for (;;) {
			if (kva_seq_open(w, &seq_opts, &o) < 0 || kva_seq_match(o, tok, n, &got) < 0)
				FAIL("match: %s", kva_errmsg());
			if (got == n)
				break;
			kva_seq_close(o);
			if (++tries > 3000)
				FAIL("prefix %u: %zu of %zu tokens found after 30 s", p, got, n);
			sleep_ms(10);
		}
		kva_seq_block_table(o, &ids, &nb, &nt);
		check_values(p, ids, PREFIX_BLOCKS);
		check_decode(ids, PREFIX_BLOCKS);
		kva_seq_close(o);
		free(tok);
	}
	/* our own, as the others see them */
	kva_seq_block_table(s, &ids, &nb, &nt);
	check_values(me, ids, PREFIX_BLOCKS);
	kva_seq_close(s);
	kva_detach(w);
	printf("ok\n");
	return 0;
}

static int cmd_hold(uint32_t n)
{
	for (uint32_t k = 0; k < n; k++) {
		uint32_t id;
		uint64_t stamp = 0x6b76610000000000ull | k;

		if (kva_alloc(w, 1, &id) < 0)
			FAIL("alloc %u of %u: %s", k, n, kva_errmsg());
		if (kva_block_write(w, id, 0, &stamp, sizeof(stamp)) < 0)
			FAIL("block write: %s", kva_errmsg());
	}
	printf("held %d\n", kva_worker_slot(w));
	fflush(stdout);
	for (;;)
		pause();
}

static int cmd_attach(const char *sock, unsigned cycles)
{
	struct kva_attach_times t = { 0 };

	for (unsigned c = 0; c < cycles; c++) {
		uint64_t v = 0x1234567890abcdefull ^ c, back = 0;
		uint32_t id;

		attach(sock, "gpu-attach");
		if (kva_worker_attach_times(w, &t) < 0)
			FAIL("attach times");
		if (kva_alloc(w, 1, &id) < 0 || kva_block_write(w, id, 100, &v, sizeof(v)) < 0 ||
		    kva_block_read(w, id, 100, &back, sizeof(back)) < 0 || back != v)
			FAIL("a block written and read back: %s", kva_errmsg());
		kva_free(w, &id, 1);
		kva_detach(w);
	}
	printf("{\"chunks\":%u,\"messages\":%u,\"total_ns\":%llu,\"driver_ns\":%llu,"
	       "\"reserve_ns\":%llu,\"recv_ns\":%llu,\"import_ns\":%llu,\"map_ns\":%llu,"
	       "\"access_ns\":%llu}\n", t.chunks, t.messages, (unsigned long long)t.total_ns,
	       (unsigned long long)t.driver_ns, (unsigned long long)t.reserve_ns,
	       (unsigned long long)t.recv_ns, (unsigned long long)t.import_ns,
	       (unsigned long long)t.map_ns, (unsigned long long)t.access_ns);
	return 0;
}

static int cmd_fork(void)
{
	uint32_t bt = info->geometry.block_tokens;
	size_t n = bt + bt / 2, nb, nt;
	int32_t *tok = prefix_tokens(77, n + 1);
	uint8_t *a = malloc(info->layout.block_bytes), *b = malloc(info->layout.block_bytes);
	const uint32_t *ids;
	struct kva_seq *s, *c;
	uint32_t parent_partial;

	if (!a || !b)
		FAIL("out of memory");
	if (kva_seq_open(w, &seq_opts, &s) < 0 || kva_seq_reserve(s, n) < 0)
		FAIL("seq: %s", kva_errmsg());
	kva_seq_block_table(s, &ids, &nb, &nt);
	store(77, ids, n);
	if (kva_seq_append(s, tok, n) < 0 || kva_seq_fork(s, &c) < 0)
		FAIL("append and fork: %s", kva_errmsg());
	kva_seq_block_table(s, &ids, &nb, &nt);
	parent_partial = ids[1];
	/* the child appends: it copies the partial block first, on the device */
	if (kva_seq_append(c, tok + n, 1) < 0)
		FAIL("append on the fork: %s", kva_errmsg());
	kva_seq_block_table(c, &ids, &nb, &nt);
	if (ids[1] == parent_partial)
		FAIL("the fork's partial block was not copied");
	if (kva_block_read(w, parent_partial, 0, a, info->layout.block_bytes) < 0 ||
	    kva_block_read(w, ids[1], 0, b, info->layout.block_bytes) < 0)
		FAIL("block read: %s", kva_errmsg());
	if (memcmp(a, b, info->layout.block_bytes))
		FAIL("the fork's copy of the partial block differs from the parent's");
	check_values(77, ids, 1);
	kva_seq_close(c);
	kva_seq_close(s);
	kva_detach(w);
	free(a);
	free(b);
	free(tok);
	printf("ok\n");
	return 0;
}

static int cmd_outlive(void)
{
	uint64_t v = 0xfeedfacecafebeefull, back = 0;
	char line[16];
	uint32_t id;
	int ret;

	if (kva_alloc(w, 1, &id) < 0 || kva_block_write(w, id, 0, &v, sizeof(v)) < 0)
		FAIL("alloc and write: %s", kva_errmsg());
	printf("attached\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		FAIL("stdin closed");
	/* the agent is gone: the connection says so, the mapping still works */
	for (int k = 0; (ret = kva_worker_poll(w)) == 0 && k < 500; k++)
		sleep_ms(10);
	if (ret != -ECONNRESET && ret != -ESHUTDOWN)
		FAIL("kva_worker_poll: %d, not the agent gone", ret);
	if (kva_block_read(w, id, 0, &back, sizeof(back)) < 0 || back != v)
		FAIL("the block after the agent left: %s", kva_errmsg());
	kva_free(w, &id, 1);
	kva_detach(w);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: gpu_worker SOCKET share I N | hold N | attach [K] | fork | "
			"outlive\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[2], "attach"))
		return cmd_attach(argv[1], argc > 3 ? (unsigned)atoi(argv[3]) : 1);
	attach(argv[1], argv[2]);
	if (!strcmp(argv[2], "share") && argc == 5)
		return cmd_share((uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]));
	if (!strcmp(argv[2], "hold") && argc == 4)
		return cmd_hold((uint32_t)atoi(argv[3]));
	if (!strcmp(argv[2], "fork"))
		return cmd_fork();
	if (!strcmp(argv[2], "outlive"))
		return cmd_outlive();
	fprintf(stderr, "gpu_worker: unknown command %s\n", argv[2]);
	return 2;
}
