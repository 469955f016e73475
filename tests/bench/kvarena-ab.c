/* SPDX-License-Identifier: MIT */
/*
 * kvarena-ab - kva_decode of several builds of libkvarena in one process, in
 * turns over the same paged KV cache: a paired comparison of builds, for
 * whoever changes the kernels.
 *
 *   kvarena-ab [options] LIB LIB...   (each LIB a path to a libkvarena.so)
 *   kvarena-ab --pf-step 4,8 LIB LIB  (one build, two of its options)
 *
 * Each build is loaded with dlopen(RTLD_LOCAL) from its own file, so each
 * has its own symbols, thread pool and scratch; the cache, the page table
 * and q are this program's, the same for all. A round times every build
 * once (about 20 ms of calls each), in ABBA order; the speed of build i
 * against the first is the median over rounds of round time of the first /
 * round time of i. On a host whose speed changes from one run to the next
 * (the VMs the README's figures come from: 2.8 and 4.5 ns for the same pair
 * minutes apart), a run of `kvarena-bench decode` per build cannot resolve
 * a few percent; rounds a few milliseconds apart can.
 *
 * The cache: block-major pages as an arena lays them out (a page is one
 * block: K then V, each [head][token][dim]), f16, in random order over
 * --pages pages of private memory, random values; q f32. With --one-page
 * every page of every sequence is the same page: at --kv-heads 1 its K and
 * V (8 KiB at head_dim 128) stay in L1, so the rounds time the tile's own
 * work, with no memory to wait for (the prefetches still issue, to lines
 * already there). --cycle N takes the sequences' pages from N distinct
 * pages in turn (--one-page is --cycle 1; 0, the default, all distinct):
 * at 8 KV heads 8 pages (512 KiB) stay in a Zen 4's L2, 64 in its L3.
 * Two values and one build compare the two page tables over the same
 * cache: what memory costs the decode, in one process. With --hugepages the cache is on 2 MiB huge pages
 * (MAP_HUGETLB, from the system's pool), as `kvarena-agent --hugepages`
 * puts an arena. --memory says what other memory the cache is: private
 * anonymous memory (the default), or a memfd shared as an arena's data is,
 * on 4 KiB pages (shmem) or on transparent huge pages (thp: MADV_HUGEPAGE,
 * as the library maps an arena's data; the system's shmem_enabled decides).
 * With two kinds and one build, the rounds compare the kinds: two caches of
 * the same contents and page table, the build's speed on the second against
 * the first.
 *
 * Output: one JSON object per build on stdout:
 *   lib          the path
 *   isa          the path asked for (--isa; "auto" is each build's best)
 *   batch, context, kv_heads, head_dim, group, threads, rounds, one_page,
 *   hugepages, pf_step   as run (pf_step 0: the build picks it)
 *   layout       "hnd" (a page's K as [head][token][dim], as an arena's)
 *                or "nhd" (--nhd: [token][head][dim], as vLLM's)
 *   cycle        distinct pages the sequences' pages cycle over (0: all)
 *   memory       the cache's memory: private, hugetlb, shmem or thp
 *   huge_bytes   of the cache, bytes mapped by 2 MiB pages (smaps)
 *   gbps         K and V bytes per second, the median round
 *   gbps_min, gbps_max   the slowest and the fastest round
 *   speed        the median of (first build's round time / this build's)
 *   speed_q1, speed_q3   its quartiles
 *   max_abs_diff the largest difference of an output element from the
 *                first build's (a build that computes something else shows
 *                here, not only in the tests); null with two --cycle
 *                values, whose tables read different pages
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvarena.h"
/* the clock and the generator (inline in bench.h); not bench.c, whose
 * functions call the library: a build linked in would stand in the global
 * scope, where the loaded builds' own calls could bind to it */
#include "bench.h"

#define MAX_LIBS 8
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function pointers are not void *");
#define MAX_ROUNDS 999
#define HUGE_BYTES ((size_t)2 << 20)

enum ab_mem { MEM_PRIVATE, MEM_HUGETLB, MEM_SHMEM, MEM_THP };
static const char *const mem_names[] = { "private", "hugetlb", "shmem", "thp" };

typedef int (*decode_fn)(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
			 const void *q, enum kva_dtype q_dtype, int32_t num_q_heads, float sm_scale,
			 void *out, float *lse, const struct kva_decode_opts *opts);

/* the cache's element types: their names (as kva_dtype_name), sizes; a
 * table of its own, since this program links no build of the library */
static const struct {
	const char *name;
	enum kva_dtype dt;
	int size;
} dtypes[] = {
	{ "f16", KVA_F16, 2 },	{ "bf16", KVA_BF16, 2 },	 { "f32", KVA_F32, 4 },
	{ "fp8_e4m3", KVA_FP8_E4M3, 1 }, { "int8", KVA_INT8, 1 },
};
#define N_DTYPES (int)(sizeof(dtypes) / sizeof(dtypes[0]))

struct ab_opts {
	int group, threads, batch, context, rounds, kv_heads, head_dim;
	int dt; /* dtypes[]'s */
	float q_amp; /* q uniform in [-q_amp, q_amp] */
	long pages;
	enum kva_isa isa;
	const char *isa_name; /* as given to --isa */
	bool one_page, hugepages, nhd;
	int pf_step[MAX_LIBS]; /* struct kva_decode_opts's, each build's */
	int n_pf_steps;        /* how many --pf-step gave */
	enum ab_mem mem[2];    /* the cache's memory; a second kind to compare */
	int n_mems;
	long cycle[2];         /* distinct pages the page table cycles over (0:
				* all distinct); a second table to compare */
	int n_cycles;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvarena-ab [options] LIB LIB...\n\n"
		"kva_decode of each libkvarena build in turn, in one process, over the same\n"
		"paged KV cache (block-major pages of 16 tokens in random order). One JSON\n"
		"line per build: its median GB/s and its median speed against the first.\n\n"
		"  --dtype NAME   the cache's: f16 (default), bf16, f32, fp8_e4m3 (a scale\n"
		"                 a KV head), int8 (a scale a token and KV head)\n"
		"  --group N      query heads per KV head (default 4)\n"
		"  --threads N    kva_decode threads (default 2)\n"
		"  --batch N      sequences (default 8)\n"
		"  --context N    tokens per sequence (default 4096)\n"
		"  --kv-heads N   (default 8)\n"
		"  --head-dim N   (default 128)\n"
		"  --pages N      pages the sequences' pages are scattered over (default 16384)\n"
		"  --one-page     every page of every sequence is one page (in L1 at\n"
		"                 --kv-heads 1): the tile's own cost, without memory\n"
		"  --cycle A[,B]  the sequences' pages taken from A distinct pages in\n"
		"                 turn (0: all distinct, the default; 1: --one-page).\n"
		"                 Two values and one build: the build over the second\n"
		"                 page table against the first, one cache\n"
		"  --hugepages    the cache on 2 MiB huge pages (needs vm.nr_hugepages)\n"
		"  --memory A[,B] the cache's memory: private (default), hugetlb (as\n"
		"                 --hugepages), shmem (a memfd, as an arena's data, on\n"
		"                 4 KiB pages), thp (the same with MADV_HUGEPAGE, as the\n"
		"                 library maps an arena's data). Two kinds and one build:\n"
		"                 the build on the second against the first\n"
		"  --isa NAME     avx2 (default), avx512, scalar, auto\n"
		"  --q-amp X      q uniform in [-X, X] (default 1; past about 20 at\n"
		"                 head_dim 128 a block's logits spread over more than\n"
		"                 126 powers of two, whose smallest exponentials\n"
		"                 would be denormals)\n"
		"  --rounds N     rounds, 1..%d (default 30)\n"
		"  --pf-step A,B,...  kva_decode_opts.pf_step of each build in turn (the\n"
		"                 AVX2 tile's step of one head's rows, 0..48; default 0,\n"
		"                 the step the build picks for this CPU); one value is\n"
		"                 every build's. A build given twice with two steps\n"
		"                 compares the steps\n"
		"  --nhd          pages token-major, [token][head][dim] (vLLM's), not\n"
		"                 [head][token][dim]: a head's rows of a page are\n"
		"                 rows apart, not one piece\n"
		"  --help         this text\n",
		MAX_ROUNDS);
}

static int parse(int argc, char **argv, struct ab_opts *o)
{
	static const struct option lo[] = {
		{ "group", required_argument, 0, 'g' },	 { "threads", required_argument, 0, 't' },
		{ "batch", required_argument, 0, 'b' },	 { "context", required_argument, 0, 'c' },
		{ "kv-heads", required_argument, 0, 'k' }, { "head-dim", required_argument, 0, 'd' },
		{ "pages", required_argument, 0, 'p' },	 { "isa", required_argument, 0, 'i' },
		{ "rounds", required_argument, 0, 'r' },	 { "help", no_argument, 0, 'h' },
		{ "one-page", no_argument, 0, '1' },	 { "hugepages", no_argument, 0, 'H' },
		{ "pf-step", required_argument, 0, 's' }, { "memory", required_argument, 0, 'm' },
		{ "cycle", required_argument, 0, 'y' },	 { "dtype", required_argument, 0, 'T' },
		{ "q-amp", required_argument, 0, 'a' },	 { "nhd", no_argument, 0, 'N' },
		{ 0, 0, 0, 0 }
	};
	int c;

	*o = (struct ab_opts){ .group = 4, .threads = 2, .batch = 8, .context = 4096, .rounds = 30,
			       .kv_heads = 8, .head_dim = 128, .pages = 16384, .isa = KVA_ISA_AVX2,
			       .isa_name = "avx2", .q_amp = 1.0f };
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'g': o->group = atoi(optarg); break;
		case 't': o->threads = atoi(optarg); break;
		case 'b': o->batch = atoi(optarg); break;
		case 'c': o->context = atoi(optarg); break;
		case 'k': o->kv_heads = atoi(optarg); break;
		case 'd': o->head_dim = atoi(optarg); break;
		case 'p': o->pages = atol(optarg); break;
		case 'r': o->rounds = atoi(optarg); break;
		case 'a': o->q_amp = strtof(optarg, NULL); break;
		case '1': o->one_page = true; break;
		case 'H': o->hugepages = true; break;
		case 'N': o->nhd = true; break;
		case 'T':
			for (o->dt = 0; o->dt < N_DTYPES && strcmp(optarg, dtypes[o->dt].name); o->dt++)
				;
			if (o->dt == N_DTYPES) {
				fprintf(stderr, "kvarena-ab: --dtype: f16, bf16, f32, fp8_e4m3 or int8\n");
				return -EINVAL;
			}
			break;
		case 'y':
			o->n_cycles = 0;
			for (char *p = strtok(optarg, ","); p; p = strtok(NULL, ",")) {
				char *end;
				long v = strtol(p, &end, 10);

				if (end == p || *end || v < 0 || v > (1l << 24) || o->n_cycles == 2) {
					fprintf(stderr, "kvarena-ab: --cycle: one or two numbers "
							"0..%ld\n", 1l << 24);
					return -EINVAL;
				}
				o->cycle[o->n_cycles++] = v;
			}
			break;
		case 'm':
			o->n_mems = 0;
			for (char *p = strtok(optarg, ","); p; p = strtok(NULL, ",")) {
				int k = 0;

				while (k < 4 && strcmp(p, mem_names[k]))
					k++;
				if (k == 4 || o->n_mems == 2) {
					fprintf(stderr, "kvarena-ab: --memory: one or two of private, "
							"hugetlb, shmem, thp\n");
					return -EINVAL;
				}
				o->mem[o->n_mems++] = (enum ab_mem)k;
			}
			break;
		case 's':
			for (char *p = optarg, *end;; p = end + 1) {
				long v = strtol(p, &end, 10);

				if (end == p || v < 0 || v > 48 || o->n_pf_steps == MAX_LIBS ||
				    (*end && *end != ',')) {
					fprintf(stderr, "kvarena-ab: --pf-step: up to %d numbers "
							"0..48, comma-separated\n", MAX_LIBS);
					return -EINVAL;
				}
				o->pf_step[o->n_pf_steps++] = (int)v;
				if (!*end)
					break;
			}
			break;
		case 'i':
			o->isa = !strcmp(optarg, "avx2")     ? KVA_ISA_AVX2
				 : !strcmp(optarg, "avx512") ? KVA_ISA_AVX512
				 : !strcmp(optarg, "scalar") ? KVA_ISA_SCALAR
				 : !strcmp(optarg, "auto")   ? KVA_ISA_AUTO
							     : (enum kva_isa)-1;
			o->isa_name = optarg;
			break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -EINVAL;
		}
	}
	if (o->group < 1 || o->group > 64 || o->threads < 1 || o->threads > 256 || o->batch < 1 ||
	    o->batch > 4096 || o->context < 1 || o->context > (1 << 20) || o->kv_heads < 1 ||
	    o->kv_heads > 64 || o->head_dim < 1 || o->head_dim > 1024 || o->rounds < 1 ||
	    o->rounds > MAX_ROUNDS || (int)o->isa < 0 || !(o->q_amp > 0 && o->q_amp <= 1e4f) ||
	    o->pages < (long)o->batch * ((o->context + 15) / 16) || o->pages > (1l << 24)) {
		fprintf(stderr, "kvarena-ab: an option out of range (--pages must hold batch x "
				"context / 16 pages)\n");
		return -EINVAL;
	}
	if (argc - optind < 1 || argc - optind > MAX_LIBS) {
		fprintf(stderr, "kvarena-ab: give 1 to %d library paths\n", MAX_LIBS);
		return -EINVAL;
	}
	if (o->n_pf_steps > 1 && o->n_pf_steps != argc - optind) {
		fprintf(stderr, "kvarena-ab: --pf-step: one value, or one for each build\n");
		return -EINVAL;
	}
	if ((o->n_mems == 2 || o->n_cycles == 2) && argc - optind != 1) {
		fprintf(stderr, "kvarena-ab: two --memory kinds or --cycle values compare them "
				"for one build\n");
		return -EINVAL;
	}
	if (o->n_mems == 2 && o->n_cycles == 2) {
		fprintf(stderr, "kvarena-ab: compare two --memory kinds or two --cycle values, "
				"not both\n");
		return -EINVAL;
	}
	if (o->one_page) {
		if (o->n_cycles) {
			fprintf(stderr, "kvarena-ab: --one-page is --cycle 1: give one\n");
			return -EINVAL;
		}
		o->cycle[0] = 1;
	}
	if (!o->n_cycles)
		o->n_cycles = 1;
	for (int k = 0; k < o->n_cycles; k++)
		if (o->cycle[k] > (long)o->batch * ((o->context + 15) / 16)) {
			fprintf(stderr, "kvarena-ab: --cycle: no more pages than the sequences "
					"have (batch x context / 16)\n");
			return -EINVAL;
		}
	if (o->hugepages) {
		if (o->n_mems) {
			fprintf(stderr, "kvarena-ab: --hugepages is --memory hugetlb: give one\n");
			return -EINVAL;
		}
		o->mem[0] = MEM_HUGETLB;
	}
	if (!o->n_mems)
		o->n_mems = 1;
	for (int i = o->n_pf_steps; i < MAX_LIBS; i++) /* one value is everyone's */
		o->pf_step[i] = o->n_pf_steps ? o->pf_step[0] : 0;
	return 0;
}

/* the cache, its page table, q and each build's output: this program's, the
 * same for every build */
struct ab_data {
	char *cache[2]; /* one for each --memory kind */
	size_t cache_bytes;
	float *k_scale, *v_scale; /* fp8: one a KV head; int8: one a token and KV head of each page */
	int32_t *pages, *indptr, *last;
	int32_t *table[2];  /* the page table's indices, for each --cycle value */
	float *q, *out[MAX_LIBS];
};

static void data_free(struct ab_data *d)
{
	for (int k = 0; k < 2; k++)
		if (d->cache[k])
			munmap(d->cache[k], d->cache_bytes);
	for (int k = 0; k < 2; k++)
		if (d->table[k] != d->pages)
			free(d->table[k]);
	free(d->k_scale);
	free(d->v_scale);
	free(d->pages);
	free(d->indptr);
	free(d->last);
	free(d->q);
	for (int i = 0; i < MAX_LIBS; i++)
		free(d->out[i]);
}

static int oom(void)
{
	fprintf(stderr, "kvarena-ab: out of memory\n");
	return -ENOMEM;
}

/*
 * @bytes of @kind for the cache. Huge pages are reserved at the mmap (no
 * MAP_NORESERVE): a pool too small fails here, not with SIGBUS at a page's
 * first touch. shmem and thp are a memfd mapped shared, as an arena's data
 * (thp with MADV_HUGEPAGE, as arena/region.c maps it).
 */
static void *cache_map(enum ab_mem kind, size_t bytes)
{
	void *p;
	int fd;

	if (kind == MEM_PRIVATE || kind == MEM_HUGETLB) {
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | (kind == MEM_HUGETLB ? MAP_HUGETLB : MAP_NORESERVE),
			 -1, 0);
		if (p == MAP_FAILED && kind == MEM_HUGETLB)
			fprintf(stderr, "kvarena-ab: %zu MiB of huge pages: %s (vm.nr_hugepages: %zu "
					"free ones are needed)\n",
				bytes >> 20, strerror(errno), bytes / HUGE_BYTES);
		return p == MAP_FAILED ? NULL : p;
	}
	fd = memfd_create("kvarena-ab", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
		fprintf(stderr, "kvarena-ab: a memfd of %zu MiB: %s\n", bytes >> 20, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	if (kind == MEM_THP && madvise(p, bytes, MADV_HUGEPAGE) < 0)
		fprintf(stderr, "kvarena-ab: MADV_HUGEPAGE: %s\n", strerror(errno));
	return p;
}

/* element @e of a page: a value of magnitude [0.25, 0.5) and a random sign,
 * or for int8 any of -127..127 (with scales of [1/256, 1/128)) */
static void elem_make(int dt, char *page, size_t e, uint64_t r)
{
	switch (dtypes[dt].dt) {
	case KVA_F32: {
		float f = (0.25f + (float)(r & 0x3ff) / 4096.0f) * (r & 0x400 ? -1.0f : 1.0f);

		memcpy(page + e * 4, &f, 4);
		break;
	}
	case KVA_BF16: {
		uint16_t h = (uint16_t)(0x3e80 + (r & 0x7f) + ((r & 0x80) << 8));

		memcpy(page + e * 2, &h, 2);
		break;
	}
	case KVA_FP8_E4M3: /* exponent 5 (2^-2 with bias 7), any mantissa, a sign */
		page[e] = (char)(0x28 + (r & 7) + ((r & 8) << 4));
		break;
	case KVA_INT8:
		page[e] = (char)((int)(r % 255) - 127);
		break;
	default: {
		uint16_t h = (uint16_t)(0x3400 + (r & 0x3ff) + ((r & 0x400) << 5));

		memcpy(page + e * 2, &h, 2);
	}
	}
}

/* the sequences' pages: a random choice of distinct pages of the cache (or
 * one page, the first choice, again and again), each filled by elem_make();
 * a second cache (a second --memory kind) a copy of the first */
static int data_make(const struct ab_opts *o, int nl, struct ab_data *d)
{
	const int P = 16, per_seq = (o->context + P - 1) / P;
	const size_t page_elems = (size_t)2 * o->kv_heads * P * o->head_dim;
	const size_t page_bytes = page_elems * (size_t)dtypes[o->dt].size;
	const size_t scales = dtypes[o->dt].dt == KVA_INT8 ? (size_t)o->pages * o->kv_heads * P
				: (size_t)o->kv_heads;
	const size_t used = (size_t)o->batch * per_seq;
	const size_t qn = (size_t)o->batch * o->kv_heads * o->group * o->head_dim;
	uint64_t seed = 0x6b766162ull;

	/* a whole number of huge pages */
	d->cache_bytes = ((size_t)o->pages * page_bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
	for (int k = 0; k < o->n_mems; k++)
		if (!(d->cache[k] = cache_map(o->mem[k], d->cache_bytes)))
			return -ENOMEM;
	d->pages = malloc((size_t)o->pages * sizeof(*d->pages));
	d->indptr = malloc((size_t)(o->batch + 1) * sizeof(*d->indptr));
	d->last = malloc((size_t)o->batch * sizeof(*d->last));
	d->q = malloc(qn * sizeof(*d->q));
	d->k_scale = malloc(scales * sizeof(float));
	d->v_scale = malloc(scales * sizeof(float));
	if (!d->pages || !d->indptr || !d->last || !d->q || !d->k_scale || !d->v_scale)
		return oom();
	for (size_t i = 0; i < scales; i++) {
		d->k_scale[i] = (float)(256 + bench_rand(&seed) % 256) / 65536.0f;
		d->v_scale[i] = (float)(256 + bench_rand(&seed) % 256) / 65536.0f;
		if (dtypes[o->dt].dt == KVA_FP8_E4M3)
			d->k_scale[i] *= 256.0f, d->v_scale[i] *= 256.0f; /* about 1 */
	}
	for (int i = 0; i < nl; i++)
		if (!(d->out[i] = calloc(qn, sizeof(float))))
			return oom();
	for (long i = 0; i < o->pages; i++)
		d->pages[i] = (int32_t)i;
	for (size_t i = 0; i < used; i++) {
		size_t j = i + bench_rand(&seed) % ((size_t)o->pages - i);
		int32_t x = d->pages[i];
		char *pg;

		d->pages[i] = d->pages[j];
		d->pages[j] = x;
		pg = d->cache[0] + (size_t)d->pages[i] * page_bytes;
		for (size_t e = 0; e < page_elems; e++)
			elem_make(o->dt, pg, e, bench_rand(&seed));
		if (o->n_mems == 2)
			memcpy(d->cache[1] + (size_t)d->pages[i] * page_bytes, pg, page_bytes);
	}
	for (int k = 0; k < o->n_cycles; k++) {
		if (!o->cycle[k]) {
			d->table[k] = d->pages;
			continue;
		}
		if (!(d->table[k] = malloc(used * sizeof(int32_t))))
			return oom();
		for (size_t i = 0; i < used; i++)
			d->table[k][i] = d->pages[i % (size_t)o->cycle[k]];
	}
	d->indptr[0] = 0;
	for (int b = 0; b < o->batch; b++) {
		d->indptr[b + 1] = d->indptr[b] + per_seq;
		d->last[b] = o->context - (per_seq - 1) * P;
	}
	for (size_t i = 0; i < qn; i++)
		d->q[i] = o->q_amp * ((float)(bench_rand(&seed) % 2001) / 1000.0f - 1.0f);
	return 0;
}

/* the rounds, and a line per build */
static int measure(const struct ab_opts *o, const decode_fn *fn, int nl, char *const *names,
		   struct ab_data *d)
{
	static double t[MAX_LIBS][MAX_ROUNDS];
	const int P = 16, H = o->kv_heads, D = o->head_dim, R = o->rounds;
	const size_t qn = (size_t)o->batch * H * o->group * D;
	struct kva_kv_desc kv[MAX_LIBS];
	struct kva_page_table pt[MAX_LIBS];
	struct kva_decode_opts dopt[MAX_LIBS];
	const float scale = 1.0f / sqrtf((float)D);
	const size_t es = (size_t)dtypes[o->dt].size;
	/* K and V, and int8's two scales a token and head */
	const double bytes = (double)o->batch * o->context * H *
			     ((double)D * 2 * es + (dtypes[o->dt].dt == KVA_INT8 ? 8 : 0));
	const uint64_t turn = 20000000; /* ns: about a build's turn */
	uint64_t one;
	int reps, ret;

	for (int i = 0; i < nl; i++) {
		/* with two --memory kinds or --cycle values, the one build (nl 2:
		 * twice) on each */
		const char *c = d->cache[o->n_mems == 2 ? i : 0];

		pt[i] = (struct kva_page_table){ .batch = o->batch, .page_size = P,
						 .indptr = d->indptr,
						 .indices = d->table[o->n_cycles == 2 ? i : 0],
						 .last_page_len = d->last };
		dopt[i] = (struct kva_decode_opts){ .threads = o->threads, .isa = o->isa,
						    .pf_step = o->pf_step[i] };
		kv[i] = (struct kva_kv_desc){
			.k = c, .v = c + (size_t)H * P * D * es,
			.page_stride = (int64_t)2 * H * P * D,
			.token_stride = o->nhd ? (int64_t)H * D : D,
			.head_stride = o->nhd ? D : (int64_t)P * D, .num_kv_heads = H, .head_dim = D,
			.dtype = dtypes[o->dt].dt, .page_size = P, .num_pages = (int32_t)o->pages,
			.k_scale = d->k_scale, .v_scale = d->v_scale,
		};
		if (dtypes[o->dt].dt == KVA_INT8) {
			kv[i].scale_page_stride = (int64_t)H * P;
			kv[i].scale_head_stride = P;
			kv[i].scale_token_stride = 1;
		}
	}
	/* warm up every build (its pool, its scratch), and check that it runs */
	for (int i = 0; i < nl; i++)
		if ((ret = fn[i](&kv[i], &pt[i], d->q, KVA_F32, H * o->group, scale, d->out[i], NULL,
				 &dopt[i])) < 0) {
			fprintf(stderr, "kvarena-ab: kva_decode of %s: %s\n", names[i],
				strerror(-ret));
			return ret;
		}
	one = bench_now_ns();
	fn[0](&kv[0], &pt[0], d->q, KVA_F32, H * o->group, scale, d->out[0], NULL, &dopt[0]);
	one = bench_now_ns() - one;
	reps = one >= turn ? 1 : (int)(turn / (one + 1)) + 1;
	for (int r = 0; r < R; r++)
		for (int k = 0; k < nl; k++) {
			const int i = r & 1 ? nl - 1 - k : k; /* ABBA */
			uint64_t s = bench_now_ns();

			for (int n = 0; n < reps; n++)
				fn[i](&kv[i], &pt[i], d->q, KVA_F32, H * o->group, scale, d->out[i], NULL,
				      &dopt[i]);
			t[i][r] = (double)(bench_now_ns() - s) / reps;
		}
	for (int i = 0; i < nl; i++) {
		const int m = o->n_mems == 2 ? i : 0, y = o->n_cycles == 2 ? i : 0;
		double speed[MAX_ROUNDS], times[MAX_ROUNDS], diff = 0.0;
		static char lib[6 * PATH_MAX + 1]; /* any path dlopen took, escaped whole */

		for (int r = 0; r < R; r++) {
			speed[r] = t[0][r] / t[i][r];
			times[r] = t[i][r];
		}
		char diffs[32] = "null"; /* two page tables read different pages */

		for (size_t e = 0; e < qn; e++)
			diff = fmax(diff, fabs((double)d->out[i][e] - d->out[0][e]));
		if (o->n_cycles < 2)
			snprintf(diffs, sizeof(diffs), "%.3g", diff);
		qsort(speed, (size_t)R, sizeof(double), cmp_double);
		qsort(times, (size_t)R, sizeof(double), cmp_double);
		/* a path may hold a quote or a backslash */
		bench_json_escape(names[i], lib, sizeof(lib));
		printf("{\"lib\":\"%s\",\"isa\":\"%s\",\"dtype\":\"%s\",\"batch\":%d,\"context\":%d,\"kv_heads\":%d,"
		       "\"head_dim\":%d,\"group\":%d,\"threads\":%d,\"rounds\":%d,\"q_amp\":%g,"
		       "\"one_page\":%s,\"layout\":\"%s\",\"hugepages\":%s,\"memory\":\"%s\",\"huge_bytes\":%" PRIu64 ","
		       "\"cycle\":%ld,\"pf_step\":%d,\"gbps\":%.2f,\"gbps_min\":%.2f,"
		       "\"gbps_max\":%.2f,\"speed\":%.3f,\"speed_q1\":%.3f,\"speed_q3\":%.3f,"
		       "\"max_abs_diff\":%s}\n",
		       lib, o->isa_name, dtypes[o->dt].name, o->batch, o->context, o->kv_heads, o->head_dim, o->group,
		       o->threads, R, (double)o->q_amp, o->cycle[y] == 1 ? "true" : "false",
		       o->nhd ? "nhd" : "hnd",
		       o->mem[m] == MEM_HUGETLB ? "true" : "false",
		       mem_names[o->mem[m]],
		       o->mem[m] == MEM_HUGETLB ? d->cache_bytes : bench_huge_bytes(d->cache[m]),
		       o->cycle[y], o->pf_step[i], bytes / times[R / 2], bytes / times[R - 1], bytes / times[0], speed[R / 2],
		       speed[R / 4], speed[(3 * R) / 4], diffs);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ab_data d = { 0 };
	struct ab_opts o;
	decode_fn fn[MAX_LIBS];
	int nl, ret;

	if (parse(argc, argv, &o) < 0)
		return 2;
	nl = argc - optind;
	for (int i = 0; i < nl; i++) {
		char path[4096];
		void *h, *sym;

		/* a name without a slash is a file here, not one to search for */
		snprintf(path, sizeof(path), "%s%s", strchr(argv[optind + i], '/') ? "" : "./",
			 argv[optind + i]);
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h || !(sym = dlsym(h, "kva_decode"))) {
			fprintf(stderr, "kvarena-ab: %s\n", dlerror());
			return 1;
		}
		/* POSIX makes dlsym's pointer callable; ISO C has no conversion
		 * from an object pointer to a function's: the bytes are copied */
		memcpy(&fn[i], &sym, sizeof(sym));
		for (int j = 0; j < i; j++)
			if (fn[j] == fn[i] && o.pf_step[j] == o.pf_step[i])
				fprintf(stderr, "kvarena-ab: %s is a build already loaded (the same "
						"file?): it is compared with itself\n",
					argv[optind + i]);
	}
	if (o.n_mems == 2 || o.n_cycles == 2) { /* one build, each memory or table in turn */
		char *twice[2] = { argv[optind], argv[optind] };

		fn[1] = fn[0];
		o.pf_step[1] = o.pf_step[0];
		nl = 2;
		if ((ret = data_make(&o, nl, &d)) == 0)
			ret = measure(&o, fn, nl, twice, &d);
	} else if ((ret = data_make(&o, nl, &d)) == 0) {
		ret = measure(&o, fn, nl, argv + optind, &d);
	}
	data_free(&d);
	return ret < 0 ? 1 : 0;
}
