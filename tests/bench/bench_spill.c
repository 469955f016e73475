/* SPDX-License-Identifier: MIT */
/*
 * bench_spill.c - kvarena-bench spill: the tiers below the arena, through a
 * real kvarena-agent and the public API, against what the machine does
 * without them, measured in the same run:
 *
 *   host demote   the agent copying published blocks to the host tier,
 *                 against memcpy of the same bytes (one thread)
 *   host fetch    fetches of 32-block prefixes from the host tier (the
 *                 worker copies and checks them itself), against memcpy;
 *                 latency of 1 block and of 32 against memcpy of as much
 *   disk demote   the host tier flushed to the disk tier, against raw
 *                 io_uring O_DIRECT sequential writes of the block size at
 *                 the tier's queue depth on the same file system; the page
 *                 cache's growth meanwhile, against the bytes written
 *   disk fetch    fetches from the disk tier (the agent reads into arena
 *                 blocks, the worker checks them), against raw sequential
 *                 O_DIRECT reads of the block size at the same queue depth;
 *                 latency of 1 block against a raw 1-block read, of 32
 *                 against 32 raw reads in flight at once
 *   alloc         a worker's cached kva_alloc/kva_free pair while the
 *                 agent demotes flat out, against the same pair idle (CPU
 *                 time of the measuring thread: what the agent's work costs
 *                 the pair, not the scheduler's sharing of two cores)
 *
 * One JSON object a line on stdout: "bench":"spill", "tier" ("host",
 * "disk", or "arena" for alloc), "op" ("demote", "fetch", "fetch1",
 * "alloc"), "block_bytes", "queue_depth", "gbps", "raw_gbps", "ratio"
 * (gbps / raw_gbps), "p50_us", "p99_us", "raw_p50_us", "raw_p99_us",
 * "p99_ratio" (p99_us / raw_p99_us), and per figure: "bytes", "blocks",
 * "direct", "page_cache_growth" (bytes), "page_cache_ratio" (of the bytes
 * written), "idle_ns", "busy_ns"; and "isa", the record copy path of the
 * agent and the workers (--isa, through KVA_RECORD_ISA).
 *
 * --backend cuda (see "the GPU" below): the arena on a GPU and its host
 * tier, no disk; lines of tier "host", ops "demote", "fetch", "fetch1", with
 * "backend":"cuda", "device" (its name), "raw" (the copy the raw figures
 * are of: "cuMemcpyDtoHAsync" or "cuMemcpyHtoDAsync", pinned host memory),
 * "raw_copy_bytes" (the size of the one copy raw_gbps is of),
 * "raw_block_gbps" (the same bytes in block-sized copies, queue_depth of
 * them queued before each wait) and "block_ratio" (gbps / raw_block_gbps).
 * No GPU to measure: the one line {"bench":"spill","backend":"cuda",
 * "status":"no device","reason":"..."}, and exit status 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <liburing.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvarena.h"
#include "bench.h"

#ifndef KVA_BENCH_AGENT
#define KVA_BENCH_AGENT "kvarena-agent"
#endif

#define DOC 32u            /* blocks of a prefix: a 512-token prompt at 16 a block */
#define BT 16u

struct opts {
	const char *agent, *dir, *isa;
	uint32_t layers, qd, reps;
	uint64_t mib;
	bool quick;
	bool cuda;           /* --backend cuda: the arena on GPU @device */
	uint32_t device;
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvarena-bench spill [options]\n"
"\n"
"The tiers below the arena against memcpy and raw io_uring O_DIRECT I/O in\n"
"the same run (see the top of bench_spill.c); one JSON line per figure.\n"
"\n"
"  --dir DIR       the file system of the disk tier and of the raw I/O\n"
"                  (default /var/tmp)\n"
"  --layers N      block size: N x 64 KiB (16 tokens x 8 kv heads x 128 x f16,\n"
"                  K and V, per layer; default 4: 256 KiB)\n"
"  --mib N         bytes demoted and fetched, in MiB (default 2048: a\n"
"                  demotion of 100 ms, long enough that the agent's first\n"
"                  wake-up and last round are not a tenth of it)\n"
"  --qd N          the disk tier's io_uring queue depth and the raw I/O's\n"
"                  (default 64); cuda: block-sized copies queued per wait\n"
"  --reps N        latency samples (default 200)\n"
"  --agent PATH    the kvarena-agent (default %s)\n"
"  --isa ISA       the record copy path of the agent and the workers: auto\n"
"                  (default), sse2, avx2, avx512 (KVA_RECORD_ISA)\n"
"  --backend B     host (default): as above; cuda: the arena on a GPU and its\n"
"                  host tier, against cuMemcpyDtoHAsync / cuMemcpyHtoDAsync\n"
"                  between device memory and pinned memory in the same run (no\n"
"                  disk tier). Without a GPU (no driver, or the tests' driver\n"
"                  stand-in): one \"no device\" line, exit 0\n"
"  --device N      cuda: the device ordinal, for the bench and the agent\n"
"                  (default 0)\n"
"  --quick         a few MiB, a few samples: that it runs\n",
		KVA_BENCH_AGENT);
}

/* the record copy path, for the agent (started after this) and for us */
static const char *isa_name = "auto";

static int set_isa(struct opts *o)
{
	bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	bool avx2 = __builtin_cpu_supports("avx2");
	const char *isa = o->isa ? o->isa : "auto";

	if (!strcmp(isa, "auto")) {
		isa_name = avx512 ? "avx512" : avx2 ? "avx2" : "sse2";
		unsetenv("KVA_RECORD_ISA");
		return 0;
	}
	if (strcmp(isa, "sse2") && strcmp(isa, "avx2") && strcmp(isa, "avx512")) {
		fprintf(stderr, "spill: --isa auto, sse2, avx2 or avx512\n");
		return -EINVAL;
	}
	if ((!strcmp(isa, "avx2") && !avx2) || (!strcmp(isa, "avx512") && !avx512)) {
		fprintf(stderr, "spill: --isa %s: this CPU does not have it\n", isa);
		return -ENOTSUP;
	}
	isa_name = isa;
	setenv("KVA_RECORD_ISA", isa, 1);
	return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "layers", required_argument, NULL, 'l' },
		{ "mib", required_argument, NULL, 'm' },
		{ "qd", required_argument, NULL, 'q' },
		{ "reps", required_argument, NULL, 'r' },
		{ "agent", required_argument, NULL, 'a' },
		{ "quick", no_argument, NULL, 'Q' },
		{ "isa", required_argument, NULL, 'i' },
		{ "backend", required_argument, NULL, 'B' },
		{ "device", required_argument, NULL, 'G' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool device_given = false;
	int c;

	*o = (struct opts){ .agent = KVA_BENCH_AGENT, .dir = "/var/tmp", .layers = 4, .qd = 64,
			    .reps = 200, .mib = 2048 };
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		char *end = NULL;

		switch (c) {
		case 'd': o->dir = optarg; break;
		case 'l': o->layers = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'm': o->mib = strtoull(optarg, &end, 10); break;
		case 'q': o->qd = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'r': o->reps = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'a': o->agent = optarg; break;
		case 'Q': o->quick = true; break;
		case 'i': o->isa = optarg; break;
		case 'B':
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "spill: --backend host or cuda\n");
				return -EINVAL;
			}
			o->cuda = !strcmp(optarg, "cuda");
			break;
		case 'G':
			o->device = (uint32_t)strtoul(optarg, &end, 10);
			device_given = true;
			break;
		case 'h': usage(stdout); return 1;
		default:
			fprintf(stderr, "spill: %s: unknown flag or missing value\n", argv[optind - 1]);
			return -EINVAL;
		}
		if (end && *end) {
			fprintf(stderr, "spill: %s: not a number\n", optarg);
			return -EINVAL;
		}
	}
	if (!o->layers || o->layers > 64 || o->qd < 8 || o->qd > 4096 || !o->reps || !o->mib ||
	    o->device > 1023) {
		fprintf(stderr, "spill: --layers 1..64, --qd 8..4096, --reps and --mib above 0, "
			"--device 0..1023\n");
		return -EINVAL;
	}
	if (device_given && !o->cuda) {
		fprintf(stderr, "spill: --device is for --backend cuda\n");
		return -EINVAL;
	}
	if (o->quick) {
		o->mib = 32;
		o->reps = 10;
	}
	return set_isa(o);
}

/* ------------------------------------------------------------ figures */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* the @q quantile of @n samples (sorted in place) */
static double quantile(double *v, unsigned n, double q)
{
	unsigned i;

	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_d);
	i = (unsigned)ceil(q * n) - 1;
	return v[i < n ? i : n - 1];
}

struct fig {
	const char *tier, *op;
	uint64_t block_bytes, bytes, blocks;
	uint32_t qd;
	double gbps, raw_gbps;
	double p50, p99, raw_p50, raw_p99; /* us; NaN: not measured */
	const char *extra;                 /* more fields, ",\"k\":v..." */
};

static void print_fig(const struct fig *f)
{
	printf("{\"bench\":\"spill\",\"tier\":\"%s\",\"op\":\"%s\",\"block_bytes\":%llu,"
	       "\"queue_depth\":%u,\"bytes\":%llu,\"blocks\":%llu", f->tier, f->op,
	       (unsigned long long)f->block_bytes, f->qd, (unsigned long long)f->bytes,
	       (unsigned long long)f->blocks);
	if (!isnan(f->gbps))
		printf(",\"gbps\":%.3f,\"raw_gbps\":%.3f,\"ratio\":%.3f", f->gbps, f->raw_gbps,
		       f->gbps / f->raw_gbps);
	if (!isnan(f->p50))
		printf(",\"p50_us\":%.1f,\"p99_us\":%.1f,\"raw_p50_us\":%.1f,\"raw_p99_us\":%.1f,"
		       "\"p99_ratio\":%.3f", f->p50, f->p99, f->raw_p50, f->raw_p99,
		       f->p99 / f->raw_p99);
	printf(",\"isa\":\"%s\"%s}\n", isa_name, f->extra ? f->extra : "");
	fflush(stdout);
}

/* ------------------------------------------------------------ baselines */

struct memcpy_fig {
	double gbps, p50_1, p99_1, p50_32, p99_32; /* us */
};

/* memcpy of @bytes in @bb pieces (one thread, cold buffers as large as the
 * data), and the latency of 1 and of 32 pieces */
static int memcpy_base(uint64_t bytes, uint64_t bb, unsigned reps, struct memcpy_fig *m)
{
	uint8_t *src = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
			    MAP_POPULATE, -1, 0);
	uint8_t *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
			    MAP_POPULATE, -1, 0);
	uint64_t n = bytes / bb, t0;
	double *one = calloc(reps, sizeof(double)), *many = calloc(reps, sizeof(double));

	if (src == MAP_FAILED || dst == MAP_FAILED || !one || !many)
		return -ENOMEM;
	memset(src, 0x5a, bytes);
	memset(dst, 0, bytes);
	t0 = bench_now_ns();
	for (uint64_t i = 0; i < n; i++)
		memcpy(dst + i * bb, src + i * bb, bb);
	m->gbps = (double)(n * bb) / (double)(bench_now_ns() - t0);
	for (unsigned r = 0; r < reps; r++) {
		uint64_t i = (uint64_t)r * 7919 % n, j = (uint64_t)r * 104729 % (n >= DOC ? n - DOC + 1 : 1);

		t0 = bench_now_ns();
		memcpy(dst + i * bb, src + i * bb, bb);
		one[r] = (double)(bench_now_ns() - t0) / 1e3;
		t0 = bench_now_ns();
		memcpy(dst + j * bb, src + j * bb, bb * (n >= DOC ? DOC : n));
		many[r] = (double)(bench_now_ns() - t0) / 1e3;
	}
	m->p50_1 = quantile(one, reps, 0.5);
	m->p99_1 = quantile(one, reps, 0.99);
	m->p50_32 = quantile(many, reps, 0.5);
	m->p99_32 = quantile(many, reps, 0.99);
	munmap(src, bytes);
	munmap(dst, bytes);
	free(one);
	free(many);
	return 0;
}

struct raw_fig {
	double write_gbps, read_gbps, p50_1, p99_1, p50_32, p99_32;
	bool direct;
};

/* wait for @n completions; -errno of the first that failed or fell short */
static int reap(struct io_uring *ring, unsigned n, unsigned want)
{
	int ret = 0;

	while (n--) {
		struct io_uring_cqe *cqe;
		int r = io_uring_wait_cqe(ring, &cqe);

		if (r < 0)
			return r;
		if (cqe->res != (int)want && !ret)
			ret = cqe->res < 0 ? cqe->res : -EIO;
		io_uring_cqe_seen(ring, cqe);
	}
	return ret;
}

/*
 * raw_base - what the file system does with io_uring and O_DIRECT alone: a
 * file of @bytes written sequentially in @bb writes, @qd in flight, read back
 * the same way; then the latency of one @bb read alone, and of DOC reads in
 * flight at once.
 */
static int raw_base(const char *dir, uint64_t bytes, uint64_t bb, uint32_t qd, unsigned reps,
		    struct raw_fig *r)
{
	char path[512];
	struct io_uring ring;
	uint64_t n = bytes / bb, t0, next, done;
	uint8_t *buf;
	double *one = calloc(reps, sizeof(double)), *many = calloc(reps, sizeof(double));
	int fd, ret;

	snprintf(path, sizeof(path), "%s/kvarena-bench-raw.XXXXXX", dir);
	if ((fd = mkstemp(path)) < 0)
		return -errno;
	close(fd);
	fd = open(path, O_RDWR | O_DIRECT);
	r->direct = fd >= 0;
	if (fd < 0)
		fd = open(path, O_RDWR);
	unlink(path);
	if (fd < 0 || !one || !many)
		return -errno;
	if (fallocate(fd, 0, 0, (off_t)bytes) < 0 && errno != EOPNOTSUPP) {
		ret = -errno;
		goto out_fd;
	}
	buf = mmap(NULL, bb * qd, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		   -1, 0);
	if (buf == MAP_FAILED) {
		ret = -ENOMEM;
		goto out_fd;
	}
	memset(buf, 0xa5, bb * qd);
	if ((ret = io_uring_queue_init(2 * qd, &ring, 0)) < 0)
		goto out_buf;
	{
		struct iovec iov = { buf, bb * qd };

		if ((ret = io_uring_register_buffers(&ring, &iov, 1)) < 0)
			goto out_ring;
	}
	/* sequential writes, then reads, @qd in flight */
	for (int w = 1; w >= 0; w--) {
		next = done = 0;
		t0 = bench_now_ns();
		while (done < n) {
			while (next < n && next - done < qd) {
				struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
				uint8_t *b = buf + (next % qd) * bb;

				if (w)
					io_uring_prep_write_fixed(sqe, fd, b, (unsigned)bb, next * bb, 0);
				else
					io_uring_prep_read(sqe, fd, b, (unsigned)bb, next * bb);
				next++;
			}
			io_uring_submit(&ring);
			if ((ret = reap(&ring, 1, (unsigned)bb)) < 0)
				goto out_ring;
			done++;
		}
		if (w)
			r->write_gbps = (double)(n * bb) / (double)(bench_now_ns() - t0);
		else
			r->read_gbps = (double)(n * bb) / (double)(bench_now_ns() - t0);
	}
	/* latency: one read alone; DOC reads at once */
	for (unsigned k = 0; k < reps; k++) {
		uint64_t i = (uint64_t)k * 7919 % n, j = (uint64_t)k * 104729 % (n > DOC ? n - DOC : 1);
		unsigned m = n >= DOC ? DOC : (unsigned)n;

		t0 = bench_now_ns();
		io_uring_prep_read(io_uring_get_sqe(&ring), fd, buf, (unsigned)bb, i * bb);
		io_uring_submit(&ring);
		if ((ret = reap(&ring, 1, (unsigned)bb)) < 0)
			goto out_ring;
		one[k] = (double)(bench_now_ns() - t0) / 1e3;
		t0 = bench_now_ns();
		for (unsigned b = 0; b < m; b++)
			io_uring_prep_read(io_uring_get_sqe(&ring), fd, buf + (b % qd) * bb,
					   (unsigned)bb, (j + b) * bb);
		io_uring_submit(&ring);
		if ((ret = reap(&ring, m, (unsigned)bb)) < 0)
			goto out_ring;
		many[k] = (double)(bench_now_ns() - t0) / 1e3;
	}
	r->p50_1 = quantile(one, reps, 0.5);
	r->p99_1 = quantile(one, reps, 0.99);
	r->p50_32 = quantile(many, reps, 0.5);
	r->p99_32 = quantile(many, reps, 0.99);
	ret = 0;
out_ring:
	io_uring_queue_exit(&ring);
out_buf:
	munmap(buf, bb * qd);
out_fd:
	close(fd);
	free(one);
	free(many);
	return ret;
}

/* ------------------------------------------------------------ the arena */

static int32_t token_of(uint32_t d, uint32_t i)
{
	return (int32_t)((d * 2654435761u + i * 40503u) % 100000u);
}

static const struct kva_seq_opts seq_opts = { .kind = KVA_OWNER_INFERENCE, .model = "bench" };

static void doc_tokens(uint32_t d, int32_t *tok)
{
	for (uint32_t i = 0; i < DOC * BT; i++)
		tok[i] = token_of(d, i);
}

/*
 * publish - @docs prefixes of DOC blocks, written, then published as fast
 * as appends go (the agent copies them below as they come), then cached.
 * Returns the time the first append started.
 */
static int publish(struct kva_worker *w, uint32_t first, uint32_t docs, uint64_t *t0)
{
	struct kva_seq **seqs = calloc(docs, sizeof(*seqs));
	int32_t tok[DOC * BT];
	uint8_t head[4096];
	int ret = 0;

	if (!seqs)
		return -ENOMEM;
	for (uint32_t d = 0; d < docs && !ret; d++) {
		const uint32_t *ids;
		size_t nb, nt;

		if ((ret = kva_seq_open(w, &seq_opts, &seqs[d])) < 0 ||
		    (ret = kva_seq_reserve(seqs[d], DOC * BT)) < 0)
			break;
		kva_seq_block_table(seqs[d], &ids, &nb, &nt);
		/* through kva_block_write, which copies wherever the blocks are:
		 * on a GPU arena they are device memory the CPU must not touch */
		for (uint32_t b = 0; b < DOC && !ret; b++) {
			memset(head, (int)(first + d + b), sizeof(head));
			ret = kva_block_write(w, ids[b], 0, head, sizeof(head));
		}
	}
	*t0 = bench_now_ns();
	for (uint32_t d = 0; d < docs && !ret; d++) {
		doc_tokens(first + d, tok);
		ret = kva_seq_append(seqs[d], tok, DOC * BT);
	}
	for (uint32_t d = 0; d < docs; d++)
		kva_seq_close(seqs[d]);
	free(seqs);
	if (ret < 0)
		fprintf(stderr, "spill: publishing: %s\n", kva_errmsg());
	return ret;
}

/* every cached block out of the arena (and below): allocate all, free all */
static void evict_all(struct kva_worker *w)
{
	uint32_t blocks = kva_arena_info(kva_worker_arena(w))->blocks, n = 0, *ids;

	ids = malloc(sizeof(*ids) * blocks);
	if (!ids)
		return;
	while (n < blocks && kva_alloc(w, 1, ids + n) == 0)
		n++;
	kva_free(w, ids, n);
	free(ids);
}

static struct kva_tiers_stats tstats(struct kva_arena *obs)
{
	struct kva_tiers_stats st;

	kva_arena_tier_stats(obs, &st);
	return st;
}

/* until @what of the tier stats reaches @n (30 s at most); the time then */
enum { BACKED, DISK_IN };
static int wait_for(struct kva_arena *obs, int what, uint64_t n, uint64_t *t)
{
	uint64_t deadline = bench_now_ns() + 30000000000ull;

	for (;;) {
		struct kva_tiers_stats st = tstats(obs);
		uint64_t v = what == BACKED ? st.backed : st.tier[KVA_TIER_DISK].records_in;

		*t = bench_now_ns();
		if (v >= n)
			return 0;
		if (*t > deadline) {
			fprintf(stderr, "spill: %llu of %llu %s after 30 s\n", (unsigned long long)v,
				(unsigned long long)n, what == BACKED ? "copied" : "written to disk");
			return -ETIMEDOUT;
		}
		bench_sleep_until(*t + 200000);
	}
}

/*
 * fetch_docs - match and fetch prefixes [first, first + docs), @group of them
 * in flight at once, each at most @blocks blocks (1 or DOC). Every sample is
 * one group's time. Only prefixes whose every block is in tier @tier count.
 */
static int fetch_docs(struct kva_worker *w, uint32_t first, uint32_t docs, uint32_t group,
		      uint32_t blocks, int tier, double *samples, unsigned *n_samples,
		      uint64_t *bytes, uint64_t *ns)
{
	uint64_t bb = kva_arena_info(kva_worker_arena(w))->layout.block_bytes;
	int32_t tok[DOC * BT];
	struct kva_seq *s[16];

	*n_samples = 0;
	*bytes = *ns = 0;
	for (uint32_t d = 0; d < docs;) {
		uint32_t g = 0;
		uint64_t t0;

		while (g < group && d < docs) {
			struct kva_match m;
			size_t below;

			doc_tokens(first + d++, tok);
			if (kva_seq_open(w, &seq_opts, &s[g]) < 0 ||
			    kva_seq_match_tiers(s[g], tok, DOC * BT, &m) < 0)
				return -EIO;
			below = tier == KVA_TIER_DISK ? m.below_disk_tokens : m.below_host_tokens;
			if (m.tokens || below != DOC * BT) {
				kva_seq_close(s[g]); /* not all there: not this figure's */
				continue;
			}
			g++;
		}
		if (!g)
			continue;
		t0 = bench_now_ns();
		for (uint32_t k = 0; k < g; k++)
			if (kva_seq_fetch_start(s[k], blocks * BT) < 0)
				return -EIO;
		for (uint32_t k = 0; k < g; k++) {
			struct kva_fetch_result r;

			if (kva_seq_fetch_wait(s[k], 10000, &r) < 0 || r.fetched_tokens != blocks * BT) {
				fprintf(stderr, "spill: a fetch of %u blocks brought %zu tokens (%u "
					"failed): %s\n", blocks, r.fetched_tokens, r.failed_blocks,
					kva_errmsg());
				return -EIO;
			}
			*bytes += blocks * bb;
		}
		*ns += bench_now_ns() - t0;
		samples[(*n_samples)++] = (double)(bench_now_ns() - t0) / 1e3;
		for (uint32_t k = 0; k < g; k++)
			kva_seq_close(s[k]);
	}
	return 0;
}

/* the page cache of files: "Cached" without "Shmem" (memfds, the arena's
 * and the host tier's memory, are counted in both) */
static int64_t page_cache(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kb, cached = 0, shmem = 0;

	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Cached: %llu kB", &kb) == 1)
			cached = kb;
		if (sscanf(line, "Shmem: %llu kB", &kb) == 1)
			shmem = kb;
	}
	if (f)
		fclose(f);
	return (int64_t)(cached - shmem) * 1024;
}

/*
 * latency - @reps samples of fetching @blocks blocks (1 or DOC) of one
 * prefix alone, from tier @tier: passes over the prefixes, each after an
 * eviction of everything (so that they are below again).
 */
static int latency(struct kva_worker *w, uint32_t docs, uint32_t blocks, int tier, unsigned reps,
		   double *lat, unsigned *n)
{
	double *one = calloc(docs, sizeof(double));
	uint64_t bytes, ns;
	unsigned got;
	int ret = 0;

	*n = 0;
	if (!one)
		return -ENOMEM;
	while (*n < reps) {
		evict_all(w);
		if ((ret = fetch_docs(w, 0, docs, 1, blocks, tier, one, &got, &bytes, &ns)) < 0)
			break;
		if (!got) {
			ret = -ENODATA;
			break;
		}
		for (unsigned k = 0; k < got && *n < reps; k++)
			lat[(*n)++] = one[k];
	}
	free(one);
	return ret;
}

/* ------------------------------------------------------------ alloc, busy */

struct pair_msg {
	double idle_cpu, busy_cpu, idle_wall, busy_wall;
	int err;
};

/*
 * pair_rate - ns per cached alloc+free pair over @ms, as the median of 1 ms
 * windows: of this thread's CPU time (what the pair itself costs, not the
 * scheduler's sharing of the cores) and of wall time. The median leaves out
 * the windows a disk interrupt landed in (their time is charged to whoever
 * was interrupted).
 */
static void pair_rate(struct kva_worker *w, unsigned ms, double *cpu, double *wall)
{
	double c[1024], t[1024];
	unsigned n = 0;
	uint32_t id;

	while (n < ms && n < 1024) {
		struct timespec c0, c1;
		uint64_t t0 = bench_now_ns(), end = t0 + 1000000, pairs = 0;

		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
		while (bench_now_ns() < end) {
			for (int k = 0; k < 1024; k++)
				if (kva_alloc(w, 1, &id) < 0 || kva_free(w, &id, 1) < 0) {
					*cpu = *wall = NAN; /* no room: the arena is too small */
					return;
				}
			pairs += 1024;
		}
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
		c[n] = ((double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec)) /
		       (double)pairs;
		t[n++] = (double)(bench_now_ns() - t0) / (double)pairs;
	}
	*cpu = quantile(c, n, 0.5);
	*wall = quantile(t, n, 0.5);
}

/* a child attached to the agent: the pair idle, then (told by @go) busy */
static void pair_child(const char *socket, int go, int out)
{
	struct pair_msg m = { 0 };
	struct kva_worker *w;
	char c;

	if (kva_attach(socket, "bench-pair", &w) < 0) {
		m.err = -EIO;
	} else {
		pair_rate(w, 200, &m.idle_cpu, &m.idle_wall); /* warm-up */
		pair_rate(w, 300, &m.idle_cpu, &m.idle_wall);
		if (write(out, &m, sizeof(m)) != sizeof(m) || read(go, &c, 1) != 1)
			_exit(1);
		pair_rate(w, 300, &m.busy_cpu, &m.busy_wall);
		kva_detach(w);
	}
	_exit(write(out, &m, sizeof(m)) == sizeof(m) ? 0 : 1);
}

/* ------------------------------------------------------------ runs */

static int agent_up(const struct opts *o, struct bench_agent *ap, const char *const *extra,
		    struct kva_arena **obs, struct kva_worker **w)
{
	int ret = bench_agent_start(o->agent, extra, ap, obs);

	if (ret < 0)
		return ret;
	if ((ret = kva_attach(ap->socket, "bench-spill", w)) < 0) {
		fprintf(stderr, "spill: attach: %s\n", kva_errmsg());
		kva_arena_close(*obs);
		return bench_agent_stop(ap, ret);
	}
	return 0;
}

static int run_host(const struct opts *o, uint64_t bb, uint32_t docs, const struct memcpy_fig *mc)
{
	struct bench_agent ap = { .who = "spill" };
	char blocks[32], host[32], layers[16];
	const char *extra[] = { "--blocks", blocks, "--layers", layers, "--kv-heads", "8",
				"--head-dim", "128", "--block-tokens", "16", "--host-bytes", host,
				"--check-interval", "0", "--log-level", "warn", "--prefault", NULL };
	uint64_t total = (uint64_t)docs * DOC, t0, t1, bytes, ns;
	double *lat = calloc(o->reps + docs, sizeof(double));
	struct kva_arena *obs;
	struct kva_worker *w;
	unsigned n;
	int ret;

	snprintf(blocks, sizeof(blocks), "%llu", (unsigned long long)(total + 2 * DOC));
	snprintf(layers, sizeof(layers), "%u", o->layers);
	snprintf(host, sizeof(host), "%llu",
		 (unsigned long long)(kva_tier_record_bytes(bb) * (total + 64)));
	if (!lat || (ret = agent_up(o, &ap, extra, &obs, &w)) < 0) {
		free(lat);
		return -ENOMEM;
	}
	/* demote: everything published at once, copied by the agent. First
	 * a pass of other prefixes over the whole host tier, as memcpy's
	 * destination was written before it was timed: the agent's host tier
	 * is memory it rewrites for its whole life, and a first write to
	 * fresh pages (here, in a VM) ran at half speed in some runs. The
	 * timed pass then also pays what the steady state pays: records
	 * dropped (clock) to make room. */
	if ((ret = publish(w, docs, docs, &t0)) < 0 || (ret = wait_for(obs, BACKED, total, &t1)) < 0)
		goto out;
	evict_all(w);
	if ((ret = publish(w, 0, docs, &t0)) < 0 ||
	    (ret = wait_for(obs, BACKED, 2 * total, &t1)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "host", .op = "demote", .block_bytes = bb,
				 .bytes = total * bb, .blocks = total, .gbps =
				 (double)(total * bb) / (double)(t1 - t0), .raw_gbps = mc->gbps,
				 .p50 = NAN });
	/* fetch: 32-block prefixes, one at a time; after a pass that maps the
	 * host tier and the arena into this process's page tables (a fresh
	 * worker's first touch of a page is a fault; the baseline's buffers
	 * are populated too) */
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, 1, DOC, KVA_TIER_HOST, lat, &n, &bytes, &ns)) < 0)
		goto out;
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, 1, DOC, KVA_TIER_HOST, lat, &n, &bytes, &ns)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "host", .op = "fetch", .block_bytes = bb, .bytes = bytes,
				 .blocks = bytes / bb, .gbps = (double)bytes / (double)ns,
				 .raw_gbps = mc->gbps, .p50 = quantile(lat, n, 0.5),
				 .p99 = quantile(lat, n, 0.99), .raw_p50 = mc->p50_32,
				 .raw_p99 = mc->p99_32 });
	/* 1 block */
	if ((ret = latency(w, docs, 1, KVA_TIER_HOST, o->reps, lat, &n)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "host", .op = "fetch1", .block_bytes = bb, .bytes = n * bb,
				 .blocks = n, .gbps = NAN, .p50 = quantile(lat, n, 0.5),
				 .p99 = quantile(lat, n, 0.99), .raw_p50 = mc->p50_1,
				 .raw_p99 = mc->p99_1 });
out:
	kva_detach(w);
	kva_arena_close(obs);
	free(lat);
	return bench_agent_stop(&ap, ret);
}

static int run_disk(const struct opts *o, uint64_t bb, uint32_t docs, const struct raw_fig *raw)
{
	struct bench_agent ap = { .who = "spill" };
	char blocks[32], host[32], disk[32], layers[16], qd[16], dir[512], extra_buf[256];
	const char *extra[] = { "--blocks", blocks, "--layers", layers, "--kv-heads", "8",
				"--head-dim", "128", "--block-tokens", "16", "--host-bytes", host,
				"--disk-dir", dir, "--disk-bytes", disk, "--disk-queue-depth", qd,
				"--check-interval", "0", "--log-level", "warn", "--max-workers", "8",
				"--prefault", NULL };
	uint64_t total = (uint64_t)docs * DOC, rec = kva_tier_record_bytes(bb), t0, t1, bytes, ns;
	int64_t cached0, cached1;
	double *lat = calloc(o->reps + docs, sizeof(double));
	struct kva_arena *obs;
	struct kva_worker *w;
	struct pair_msg pm[2] = { { 0 } };
	int to_child[2], from_child[2];
	pid_t child;
	unsigned n;
	int ret;

	snprintf(dir, sizeof(dir), "%s/kvarena-bench-spill.XXXXXX", o->dir);
	if (!mkdtemp(dir))
		return -errno;
	/* room besides for the measuring worker's cache */
	snprintf(blocks, sizeof(blocks), "%llu", (unsigned long long)(total + 2 * DOC + 1024));
	snprintf(layers, sizeof(layers), "%u", o->layers);
	/* a host tier of a few queue depths (a quarter of the data at most):
	 * nearly everything goes to disk */
	snprintf(host, sizeof(host), "%llu",
		 (unsigned long long)(rec * (total / 4 < 4 * o->qd ? total / 4 : 4 * o->qd)));
	snprintf(disk, sizeof(disk), "%llu", (unsigned long long)(4096 + rec * (total + 64)));
	snprintf(qd, sizeof(qd), "%u", o->qd);
	if (!lat || (ret = agent_up(o, &ap, extra, &obs, &w)) < 0) {
		free(lat);
		rmdir(dir);
		return -ENOMEM;
	}
	/* a worker in another process measures its alloc/free pair, idle and
	 * while the agent demotes */
	if (pipe(to_child) < 0 || pipe(from_child) < 0) {
		ret = -errno;
		goto out;
	}
	fflush(stdout);
	child = fork();
	if (child == 0)
		pair_child(ap.socket, to_child[0], from_child[1]);
	if (read(from_child[0], &pm[0], sizeof(pm[0])) != sizeof(pm[0]) || pm[0].err) {
		ret = -EIO;
		goto out;
	}
	cached0 = page_cache();
	if (write(to_child[1], "g", 1) != 1 || (ret = publish(w, 0, docs, &t0)) < 0 ||
	    (ret = wait_for(obs, DISK_IN, total, &t1)) < 0)
		goto out;
	cached1 = page_cache();
	if (read(from_child[0], &pm[1], sizeof(pm[1])) != sizeof(pm[1]) || pm[1].err) {
		ret = -EIO;
		goto out;
	}
	bench_reap(child);
	{
		struct kva_tiers_stats st = tstats(obs);
		int64_t growth = cached1 - cached0;

		snprintf(extra_buf, sizeof(extra_buf), ",\"direct\":%s,\"page_cache_growth\":%lld,"
			 "\"page_cache_ratio\":%.5f", st.tier[KVA_TIER_DISK].direct ? "true" : "false",
			 (long long)growth, (double)growth / (double)(total * rec));
		print_fig(&(struct fig){ .tier = "disk", .op = "demote", .block_bytes = bb,
					 .qd = o->qd, .bytes = total * bb, .blocks = total,
					 .gbps = (double)(total * bb) / (double)(t1 - t0),
					 .raw_gbps = raw->write_gbps, .p50 = NAN, .extra = extra_buf });
	}
	snprintf(extra_buf, sizeof(extra_buf), ",\"idle_ns\":%.2f,\"busy_ns\":%.2f,"
		 "\"idle_wall_ns\":%.2f,\"busy_wall_ns\":%.2f,\"ratio\":%.3f", pm[0].idle_cpu,
		 pm[1].busy_cpu, pm[0].idle_wall, pm[1].busy_wall, pm[1].busy_cpu / pm[0].idle_cpu);
	print_fig(&(struct fig){ .tier = "arena", .op = "alloc", .block_bytes = bb, .qd = o->qd,
				 .gbps = NAN, .p50 = NAN, .extra = extra_buf });
	/* fetch: the prefixes on disk, enough at once to fill the queue (after
	 * a pass that maps the arena into our page tables, as for the host) */
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, o->qd / DOC ? o->qd / DOC : 1, DOC, KVA_TIER_DISK, lat,
			      &n, &bytes, &ns)) < 0)
		goto out;
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, o->qd / DOC ? o->qd / DOC : 1, DOC, KVA_TIER_DISK, lat,
			      &n, &bytes, &ns)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "disk", .op = "fetch", .block_bytes = bb, .qd = o->qd,
				 .bytes = bytes, .blocks = bytes / bb,
				 .gbps = (double)bytes / (double)ns, .raw_gbps = raw->read_gbps,
				 .p50 = NAN });
	/* latency: a 32-block prefix alone (32 reads in flight), and 1 block */
	if ((ret = latency(w, docs, DOC, KVA_TIER_DISK, o->reps, lat, &n)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "disk", .op = "fetch32", .block_bytes = bb, .qd = DOC,
				 .bytes = (uint64_t)n * DOC * bb, .blocks = n * DOC, .gbps = NAN,
				 .p50 = quantile(lat, n, 0.5), .p99 = quantile(lat, n, 0.99),
				 .raw_p50 = raw->p50_32, .raw_p99 = raw->p99_32 });
	if ((ret = latency(w, docs, 1, KVA_TIER_DISK, o->reps, lat, &n)) < 0)
		goto out;
	print_fig(&(struct fig){ .tier = "disk", .op = "fetch1", .block_bytes = bb, .qd = 1,
				 .bytes = n * bb, .blocks = n, .gbps = NAN,
				 .p50 = quantile(lat, n, 0.5), .p99 = quantile(lat, n, 0.99),
				 .raw_p50 = raw->p50_1, .raw_p99 = raw->p99_1 });
out:
	kva_detach(w);
	kva_arena_close(obs);
	free(lat);
	ret = bench_agent_stop(&ap, ret);
	{
		char file[600];

		snprintf(file, sizeof(file), "%s/kvarena-kvarena-bench.tier", dir);
		unlink(file);
		rmdir(dir);
	}
	return ret;
}

/* ------------------------------------------------------------ the GPU */

/*
 * --backend cuda: the agent's arena in a GPU's memory (kvarena-agent
 * --backend cuda) with a host tier, against what the device's copy engines
 * do between device memory and pinned host memory, measured first, in this
 * process (gpu_base):
 *
 *   host demote   published blocks copied down by the agent: per block a
 *                 cuMemcpyDtoHAsync into its pinned host tier, a wait for its
 *                 stream, XXH3 on the CPU; against the DtoH peak
 *   host fetch    32-block prefixes brought back from the host tier, one at
 *                 a time (the agent copies each block up: cuMemcpyHtoDAsync
 *                 and a wait); against the HtoD peak; latency against 32
 *                 block-sized HtoD copies queued at once
 *   host fetch1   latency of 1 block, against one block-sized HtoD copy
 *
 * The peaks: one copy of GPU_PEAK_BYTES each way, the best of GPU_PEAK_REPS
 * (raw_gbps, what the ratio is of); and the same bytes in copies of one
 * block, --qd of them queued before each wait, the best likewise
 * (raw_block_gbps: what copies of one block can get, their per-copy cost
 * included). Wall clock, from the first copy queued until the wait for the
 * stream returns, as the agent lives a copy.
 */
#define GPU_PEAK_BYTES (256ull << 20)
#define GPU_PEAK_BYTES_QUICK (32ull << 20)
#define GPU_PEAK_REPS 5u

struct gpu_fig {
	char device[512];           /* escaped for JSON */
	uint64_t copy_bytes;        /* of each large copy */
	double dtoh_gbps, htod_gbps, dtoh_block_gbps, htod_block_gbps;
	double p50_1, p99_1, p50_32, p99_32; /* us: HtoD of 1 block, of DOC at once */
};

/* @bytes from @src to @dst in copies of @piece, @depth queued before each
 * wait; the wall clock of it all, in ns */
static int gpu_copy_run(struct bench_gpu *g, enum bench_gpu_dir dir, uint8_t *dst,
			const uint8_t *src, uint64_t bytes, uint64_t piece, uint32_t depth,
			double *ns)
{
	uint64_t t0 = bench_now_ns(), n = bytes / piece;
	int ret = 0;

	for (uint64_t i = 0; i < n && ret == 0; i++) {
		ret = bench_gpu_copy_async(g, dir, dst + i * piece, src + i * piece, piece);
		if (ret == 0 && ((i + 1) % depth == 0 || i + 1 == n))
			ret = bench_gpu_sync(g);
	}
	*ns = (double)(bench_now_ns() - t0);
	return ret;
}

/* the peaks and latencies of gpu_fig, on buffers of @bytes */
static int gpu_measure(const struct opts *o, struct bench_gpu *g, uint8_t *host, uint8_t *dev,
		       uint64_t bytes, uint64_t bb, struct gpu_fig *f)
{
	double best[4] = { INFINITY, INFINITY, INFINITY, INFINITY }, ns;
	double *one = calloc(o->reps, sizeof(double)), *many = calloc(o->reps, sizeof(double));
	uint64_t n = bytes / bb;
	int ret = 0;

	if (!one || !many) {
		ret = -ENOMEM;
		goto out;
	}
	/* unmeasured: the first copy maps what the driver maps lazily */
	if ((ret = gpu_copy_run(g, BENCH_GPU_HTOD, dev, host, bytes, bytes, 1, &ns)) < 0 ||
	    (ret = gpu_copy_run(g, BENCH_GPU_DTOH, host, dev, bytes, bytes, 1, &ns)) < 0)
		goto out;
	for (unsigned r = 0; r < (o->quick ? 2 : GPU_PEAK_REPS); r++) {
		if ((ret = gpu_copy_run(g, BENCH_GPU_DTOH, host, dev, bytes, bytes, 1, &ns)) < 0)
			goto out;
		best[0] = fmin(best[0], ns);
		if ((ret = gpu_copy_run(g, BENCH_GPU_HTOD, dev, host, bytes, bytes, 1, &ns)) < 0)
			goto out;
		best[1] = fmin(best[1], ns);
		if ((ret = gpu_copy_run(g, BENCH_GPU_DTOH, host, dev, n * bb, bb, o->qd, &ns)) < 0)
			goto out;
		best[2] = fmin(best[2], ns);
		if ((ret = gpu_copy_run(g, BENCH_GPU_HTOD, dev, host, n * bb, bb, o->qd, &ns)) < 0)
			goto out;
		best[3] = fmin(best[3], ns);
	}
	f->copy_bytes = bytes;
	f->dtoh_gbps = (double)bytes / best[0];
	f->htod_gbps = (double)bytes / best[1];
	f->dtoh_block_gbps = (double)(n * bb) / best[2];
	f->htod_block_gbps = (double)(n * bb) / best[3];
	/* latency: one block alone; DOC blocks queued at once, one wait */
	for (unsigned r = 0; r < o->reps; r++) {
		uint64_t i = (uint64_t)r * 7919 % n, j = (uint64_t)r * 104729 % (n > DOC ? n - DOC : 1);
		uint32_t m = n >= DOC ? DOC : (uint32_t)n;

		if ((ret = gpu_copy_run(g, BENCH_GPU_HTOD, dev + i * bb, host + i * bb, bb, bb, 1,
					&ns)) < 0)
			goto out;
		one[r] = ns / 1e3;
		if ((ret = gpu_copy_run(g, BENCH_GPU_HTOD, dev + j * bb, host + j * bb, m * bb, bb,
					m, &ns)) < 0)
			goto out;
		many[r] = ns / 1e3;
	}
	f->p50_1 = quantile(one, o->reps, 0.5);
	f->p99_1 = quantile(one, o->reps, 0.99);
	f->p50_32 = quantile(many, o->reps, 0.5);
	f->p99_32 = quantile(many, o->reps, 0.99);
out:
	free(one);
	free(many);
	return ret;
}

/*
 * gpu_base - the device's copy peaks, in this process, before the agent
 * starts. Return: 0; 1 when there is no GPU to measure (one "no device"
 * line printed); or -errno, told on stderr.
 */
static int gpu_base(const struct opts *o, uint64_t bb, struct gpu_fig *f)
{
	uint64_t bytes = (o->quick ? GPU_PEAK_BYTES_QUICK : GPU_PEAK_BYTES) / bb * bb;
	struct bench_gpu *g;
	void *host = NULL, *dev = NULL;
	char why[512];
	int ret = bench_gpu_open((int)o->device, &g, why, sizeof(why));

	if (ret == -ENODEV)
		return bench_gpu_no_device("spill", "no device", why) < 0 ? -EIO : 1;
	if (ret < 0) {
		fprintf(stderr, "spill: --backend cuda: %s\n", why);
		return ret;
	}
	bench_json_escape(bench_gpu_name(g), f->device, sizeof(f->device));
	if (!bytes) {
		fprintf(stderr, "spill: a block of %llu KiB is more than the peaks' buffer\n",
			(unsigned long long)bb >> 10);
		ret = -EINVAL;
	} else {
		fprintf(stderr, "spill: GPU %d: %s; copy peaks over %llu MiB of pinned memory\n",
			bench_gpu_ordinal(g), bench_gpu_name(g), (unsigned long long)bytes >> 20);
	}
	if (ret == 0 && (ret = bench_gpu_host_alloc(g, bytes, &host)) == 0 &&
	    (ret = bench_gpu_alloc(g, bytes, &dev)) == 0) {
		memset(host, 0x5a, bytes);
		ret = gpu_measure(o, g, host, dev, bytes, bb, f);
	}
	bench_gpu_free(g, dev);
	bench_gpu_host_free(g, host);
	bench_gpu_close(g);
	return ret;
}

static int run_gpu(const struct opts *o, uint64_t bb, uint32_t docs, const struct gpu_fig *pk)
{
	struct bench_agent ap = { .who = "spill" };
	char blocks[32], host[32], layers[16], device[16], extra_buf[768];
	const char *extra[] = { "--backend", "cuda", "--device", device, "--blocks", blocks,
				"--layers", layers, "--kv-heads", "8", "--head-dim", "128",
				"--block-tokens", "16", "--host-bytes", host, "--check-interval", "0",
				"--log-level", "warn", NULL };
	uint64_t total = (uint64_t)docs * DOC, t0, t1, bytes, ns;
	double *lat = calloc(o->reps + docs, sizeof(double));
	struct kva_arena *obs;
	struct kva_worker *w;
	unsigned n;
	int ret;

	snprintf(device, sizeof(device), "%u", o->device);
	snprintf(blocks, sizeof(blocks), "%llu", (unsigned long long)(total + 2 * DOC));
	snprintf(layers, sizeof(layers), "%u", o->layers);
	snprintf(host, sizeof(host), "%llu",
		 (unsigned long long)(kva_tier_record_bytes(bb) * (total + 64)));
	if (!lat)
		return -ENOMEM;
	if ((ret = agent_up(o, &ap, extra, &obs, &w)) < 0) {
		free(lat);
		return ret;
	}
	/* demote: as run_host, after a first pass of other prefixes over the
	 * whole host tier (the steady state: records dropped to make room) */
	if ((ret = publish(w, docs, docs, &t0)) < 0 || (ret = wait_for(obs, BACKED, total, &t1)) < 0)
		goto out;
	evict_all(w);
	if ((ret = publish(w, 0, docs, &t0)) < 0 ||
	    (ret = wait_for(obs, BACKED, 2 * total, &t1)) < 0)
		goto out;
	snprintf(extra_buf, sizeof(extra_buf), ",\"backend\":\"cuda\",\"device\":\"%s\","
		 "\"raw\":\"cuMemcpyDtoHAsync\",\"raw_copy_bytes\":%llu,\"raw_block_gbps\":%.3f,"
		 "\"block_ratio\":%.3f", pk->device, (unsigned long long)pk->copy_bytes,
		 pk->dtoh_block_gbps,
		 (double)(total * bb) / (double)(t1 - t0) / pk->dtoh_block_gbps);
	print_fig(&(struct fig){ .tier = "host", .op = "demote", .block_bytes = bb, .qd = o->qd,
				 .bytes = total * bb, .blocks = total, .gbps =
				 (double)(total * bb) / (double)(t1 - t0), .raw_gbps = pk->dtoh_gbps,
				 .p50 = NAN, .extra = extra_buf });
	/* fetch: 32-block prefixes one at a time, after an unmeasured pass */
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, 1, DOC, KVA_TIER_HOST, lat, &n, &bytes, &ns)) < 0)
		goto out;
	evict_all(w);
	if ((ret = fetch_docs(w, 0, docs, 1, DOC, KVA_TIER_HOST, lat, &n, &bytes, &ns)) < 0)
		goto out;
	snprintf(extra_buf, sizeof(extra_buf), ",\"backend\":\"cuda\",\"device\":\"%s\","
		 "\"raw\":\"cuMemcpyHtoDAsync\",\"raw_copy_bytes\":%llu,\"raw_block_gbps\":%.3f,"
		 "\"block_ratio\":%.3f", pk->device, (unsigned long long)pk->copy_bytes,
		 pk->htod_block_gbps, (double)bytes / (double)ns / pk->htod_block_gbps);
	print_fig(&(struct fig){ .tier = "host", .op = "fetch", .block_bytes = bb, .qd = o->qd,
				 .bytes = bytes, .blocks = bytes / bb,
				 .gbps = (double)bytes / (double)ns, .raw_gbps = pk->htod_gbps, .p50 = quantile(lat, n, 0.5),
				 .p99 = quantile(lat, n, 0.99), .raw_p50 = pk->p50_32,
				 .raw_p99 = pk->p99_32, .extra = extra_buf });
	if ((ret = latency(w, docs, 1, KVA_TIER_HOST, o->reps, lat, &n)) < 0)
		goto out;
	snprintf(extra_buf, sizeof(extra_buf), ",\"backend\":\"cuda\",\"device\":\"%s\","
		 "\"raw\":\"cuMemcpyHtoDAsync\"", pk->device);
	print_fig(&(struct fig){ .tier = "host", .op = "fetch1", .block_bytes = bb, .qd = 1,
				 .bytes = n * bb, .blocks = n, .gbps = NAN,
				 .p50 = quantile(lat, n, 0.5), .p99 = quantile(lat, n, 0.99),
				 .raw_p50 = pk->p50_1, .raw_p99 = pk->p99_1, .extra = extra_buf });
out:
	kva_detach(w);
	kva_arena_close(obs);
	free(lat);
	return bench_agent_stop(&ap, ret);
}

int bench_spill_main(int argc, char **argv)
{
	struct opts o;
	struct memcpy_fig mc;
	struct raw_fig raw;
	uint64_t bb;
	uint32_t docs;
	int ret;

	if ((ret = parse(argc, argv, &o)))
		return ret > 0 ? 0 : 2;
	bb = 65536ull * o.layers;
	docs = (uint32_t)((o.mib << 20) / (bb * DOC));
	if (docs < 2) {
		fprintf(stderr, "spill: --mib %llu is less than two prefixes of %u blocks of %llu "
			"KiB\n", (unsigned long long)o.mib, DOC, (unsigned long long)bb >> 10);
		return 2;
	}
	if (o.cuda) {
		struct gpu_fig pk;

		fprintf(stderr, "spill: %u prefixes of %u blocks of %llu KiB (%.0f MiB) on GPU %u, "
			"queue depth %u\n", docs, DOC, (unsigned long long)bb >> 10,
			(double)docs * DOC * bb / (1 << 20), o.device, o.qd);
		if ((ret = gpu_base(&o, bb, &pk)) != 0)
			return ret > 0 ? 0 : 1;
		if ((ret = run_gpu(&o, bb, docs, &pk)) < 0) {
			fprintf(stderr, "spill: %s\n", strerror(-ret));
			return 1;
		}
		return 0;
	}
	fprintf(stderr, "spill: %u prefixes of %u blocks of %llu KiB (%.0f MiB), queue depth %u, "
		"disk tier in %s\n", docs, DOC, (unsigned long long)bb >> 10,
		(double)docs * DOC * bb / (1 << 20), o.qd, o.dir);
	if ((ret = memcpy_base((uint64_t)docs * DOC * bb, bb, o.reps, &mc)) < 0 ||
	    (ret = raw_base(o.dir, (uint64_t)docs * DOC * bb, bb, o.qd, o.reps, &raw)) < 0) {
		fprintf(stderr, "spill: the baselines: %s\n", strerror(-ret));
		return 1;
	}
	if (!raw.direct)
		fprintf(stderr, "spill: %s does not take O_DIRECT: the raw figures are buffered\n",
			o.dir);
	if ((ret = run_host(&o, bb, docs, &mc)) < 0 || (ret = run_disk(&o, bb, docs, &raw)) < 0) {
		fprintf(stderr, "spill: %s\n", strerror(-ret));
		return 1;
	}
	return 0;
}
