/* SPDX-License-Identifier: MIT */
/*
 * test_cuda.c - the CUDA decode and store. On any machine: the calls check
 * their host-side arguments as the CPU path does, without reading the device
 * pointers they are given; without a driver or a device they say so rather
 * than crash; the library carries a well-formed fatbin holding sm_80 and
 * sm_90 cubins and compute_90 PTX with every kernel cuda.c looks up. Where a
 * driver and a device are present: store and decode on the GPU give what
 * the CPU gives on the same data, and a bad page id or slot is caught on the
 * device.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_pvt.h"
#include "decode_math.h"
#include "kvarena.h"
#include "testutil.h"

/* An address no host code may read: the calls get it for every device
 * pointer when they must fail on the host, so a host read would crash. */
#define DEVICE_ONLY ((void *)(uintptr_t)0x1000)

static const char *const kernel_names[] = {
	KVA__CUDA_FN_Q, KVA__CUDA_FN_TILE, KVA__CUDA_FN_MERGE, KVA__CUDA_FN_STORE_CHECK,
	KVA__CUDA_FN_STORE,
};

/* ------------------------------------------------------ no driver needed */

static void test_available_says_why_it_cannot_run(void **state)
{
	size_t len;
	const void *fatbin = kva__cuda_fatbin(&len);
	int ret = kva_cuda_available();

	(void)state;
	fprintf(stderr, "  kva_cuda_available: %d (%s)\n", ret, ret ? kva_errmsg() : "usable");
	if (!fatbin) {
		assert_int_equal(ret, -ENOTSUP);
		assert_non_null(strstr(kva_errmsg(), "without nvcc"));
	} else {
		assert_true(ret == 0 || ret == -ENODEV);
		if (ret)
			assert_non_null(strstr(kva_errmsg(), "CUDA"));
	}
	/* the driver is probed once; the answer and the message stay */
	assert_int_equal(kva_cuda_available(), ret);
}

static struct kva_kv_desc device_only_desc(void)
{
	/* HND, f16, 2 KV heads of 64, 8 pages of 16 tokens */
	return (struct kva_kv_desc){
		.k = DEVICE_ONLY, .v = DEVICE_ONLY, .page_stride = 2 * 16 * 64,
		.token_stride = 64, .head_stride = 16 * 64, .num_kv_heads = 2, .head_dim = 64,
		.dtype = KVA_F16, .page_size = 16, .num_pages = 8,
	};
}

static void test_host_arguments_are_checked_before_the_driver(void **state)
{
	const struct kva_kv_desc good = device_only_desc();
	const struct kva_page_table pt = { 2, 16, DEVICE_ONLY, DEVICE_ONLY, DEVICE_ONLY };
	struct kva_page_table bad_pt;
	struct kva_kv_desc kv;
	struct kva_decode_opts opts = { .threads = -1 };
	int avail = kva_cuda_available();
	uint32_t errors;

	(void)state;
#define EXPECT(kvp, ptp, qh, qdt, scale, o) \
	assert_int_equal(kva_decode_cuda(kvp, ptp, DEVICE_ONLY, qdt, qh, scale, DEVICE_ONLY, \
					 NULL, o, NULL), -EINVAL)
	EXPECT(NULL, &pt, 4, KVA_F32, 1.0f, NULL);
	EXPECT(&good, NULL, 4, KVA_F32, 1.0f, NULL);
	EXPECT(&good, &pt, 3, KVA_F32, 1.0f, NULL);       /* not a multiple of the KV heads */
	EXPECT(&good, &pt, 2 * 65, KVA_F32, 1.0f, NULL);  /* 65 query heads a KV head */
	EXPECT(&good, &pt, 4, KVA_FP8_E4M3, 1.0f, NULL);  /* q and out f32, f16 or bf16 */
	EXPECT(&good, &pt, 4, KVA_F32, 0.0f, NULL);
	EXPECT(&good, &pt, 4, KVA_F32, NAN, NULL);
	EXPECT(&good, &pt, 4, KVA_F32, 1.0f, &opts);
	kv = good, kv.dtype = (enum kva_dtype)17;
	EXPECT(&kv, &pt, 4, KVA_F32, 1.0f, NULL);
	kv = good, kv.page_size = 8;                      /* disagrees with the table */
	EXPECT(&kv, &pt, 4, KVA_F32, 1.0f, NULL);
	assert_non_null(strstr(kva_errmsg(), "page_size"));
	kv = good, kv.head_dim = 0;
	EXPECT(&kv, &pt, 4, KVA_F32, 1.0f, NULL);
	kv = good, kv.token_stride = 10;                  /* rows would overlap */
	EXPECT(&kv, &pt, 4, KVA_F32, 1.0f, NULL);
	kv = good, kv.dtype = KVA_INT8;                   /* no scales */
	EXPECT(&kv, &pt, 4, KVA_F32, 1.0f, NULL);
	bad_pt = pt, bad_pt.indptr = NULL;
	EXPECT(&good, &bad_pt, 4, KVA_F32, 1.0f, NULL);
	bad_pt = pt, bad_pt.batch = -1;
	EXPECT(&good, &bad_pt, 4, KVA_F32, 1.0f, NULL);
	assert_int_equal(kva_decode_cuda(&good, &pt, NULL, KVA_F32, 4, 1.0f, DEVICE_ONLY, NULL, NULL,
					 NULL), -EINVAL);
#undef EXPECT

	kv = good, kv.dtype = (enum kva_dtype)0;
	assert_int_equal(kva_store_kv_cuda(NULL, DEVICE_ONLY, DEVICE_ONLY, KVA_F32, DEVICE_ONLY, 4,
					   NULL), -EINVAL);
	assert_int_equal(kva_store_kv_cuda(&kv, DEVICE_ONLY, DEVICE_ONLY, KVA_F32, DEVICE_ONLY, 4,
					   NULL), -EINVAL);
	assert_int_equal(kva_store_kv_cuda(&good, DEVICE_ONLY, DEVICE_ONLY, KVA_INT8, DEVICE_ONLY,
					   4, NULL), -EINVAL);
	assert_int_equal(kva_store_kv_cuda(&good, NULL, DEVICE_ONLY, KVA_F32, DEVICE_ONLY, 4,
					   NULL), -EINVAL);
	assert_int_equal(kva_store_kv_cuda(&good, DEVICE_ONLY, DEVICE_ONLY, KVA_F32, DEVICE_ONLY,
					   -1, NULL), -EINVAL);
	assert_int_equal(kva_cuda_take_errors(NULL), -EINVAL);

	/* well-formed calls that need nothing from the device: an empty batch,
	 * no tokens. Without a driver they give kva_cuda_available's error. */
	{
		const struct kva_page_table empty = { 0, 16, NULL, NULL, NULL };

		assert_int_equal(kva_decode_cuda(&good, &empty, DEVICE_ONLY, KVA_F32, 4, 1.0f,
						 DEVICE_ONLY, NULL, NULL, NULL), avail);
		assert_int_equal(kva_store_kv_cuda(&good, DEVICE_ONLY, DEVICE_ONLY, KVA_F32,
						   DEVICE_ONLY, 0, NULL), avail);
	}
	if (avail == 0)
		return; /* the calls below would launch kernels on DEVICE_ONLY */
	assert_int_equal(kva_decode_cuda(&good, &pt, DEVICE_ONLY, KVA_F32, 4, 1.0f, DEVICE_ONLY,
					 NULL, NULL, NULL), avail);
	assert_int_equal(kva_store_kv_cuda(&good, DEVICE_ONLY, DEVICE_ONLY, KVA_F32, DEVICE_ONLY, 4,
					   NULL), avail);
	assert_int_equal(kva_cuda_take_errors(&errors), avail);
	assert_int_equal(errors, 0);
	{
		void *p = DEVICE_ONLY;

		assert_int_equal(kva__cuda_malloc(&p, 64), avail);
		assert_null(p);
	}
}

/* ----------------------------------------------------- the fatbin itself */

static uint64_t rd(const unsigned char *p, int bytes)
{
	uint64_t x = 0;

	for (int i = bytes - 1; i >= 0; i--)
		x = x << 8 | p[i];
	return x;
}

/*
 * nvcc's fatbin container (little endian): a 16-byte header (magic
 * 0xBA55ED50, version 1, header size 16, size of the rest), then entries,
 * each a header - kind (1 PTX, 2 ELF cubin) at 0, its header size at 4, its
 * payload size at 8, the SM at 28 - and its payload.
 */
static void test_library_carries_sm80_sm90_cubins_and_ptx(void **state)
{
	size_t len, off;
	const unsigned char *fb = kva__cuda_fatbin(&len);
	bool elf80 = false, elf90 = false, ptx90 = false;
	int entries = 0;

	(void)state;
	if (!fb) {
		print_message("libkvarena was built without nvcc: it carries no fatbin\n");
		skip();
	}
	assert_true(len > 16);
	assert_int_equal(rd(fb, 4), 0xBA55ED50u);
	assert_int_equal(rd(fb + 4, 2), 1);
	assert_int_equal(rd(fb + 6, 2), 16);
	assert_int_equal(16 + rd(fb + 8, 8), len);
	assert_int_equal((uintptr_t)fb % 8, 0); /* the driver reads it in place */
	for (off = 16; off < len; entries++) {
		const unsigned char *e = fb + off;
		uint64_t kind, hsize, size, arch;

		assert_true(len - off >= 32);
		kind = rd(e, 2);
		hsize = rd(e + 4, 4);
		size = rd(e + 8, 8);
		arch = rd(e + 28, 4);
		assert_true(hsize >= 32 && hsize <= len - off && size <= len - off - hsize);
		fprintf(stderr, "  fatbin entry %d: %s sm_%u, %llu bytes\n", entries,
			kind == 2 ? "ELF" : kind == 1 ? "PTX" : "?", (unsigned)arch,
			(unsigned long long)size);
		if (kind == 2) {
			const unsigned char *elf = e + hsize;

			/* uncompressed cubins: the kernels are in their symbol table */
			assert_memory_equal(elf, "\177ELF", 4);
			assert_int_equal(rd(elf + 18, 2), 190); /* EM_CUDA */
			for (size_t k = 0; k < sizeof(kernel_names) / sizeof(kernel_names[0]); k++)
				if (!memmem(elf, size, kernel_names[k], strlen(kernel_names[k]) + 1))
					fail_msg("sm_%u cubin lacks %s", (unsigned)arch, kernel_names[k]);
			elf80 |= arch == 80;
			elf90 |= arch == 90;
		} else if (kind == 1) {
			ptx90 |= arch == 90;
		} else {
			fail_msg("fatbin entry %d of unknown kind %u", entries, (unsigned)kind);
		}
		off += hsize + size;
	}
	assert_int_equal(off, len);
	assert_true(elf80 && elf90 && ptx90);
	assert_int_equal(entries, 3);
}

/* ------------------------------------------------------ on a real device */

static float frand(uint64_t *rng)
{
	return (float)((double)(tu_rand(rng) >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

static void *dev_dup(const void *host, size_t bytes)
{
	void *d;

	assert_int_equal(kva__cuda_malloc(&d, bytes), 0);
	assert_int_equal(kva__cuda_copy(d, host, bytes, 1), 0);
	return d;
}

static void dev_get(void *host, const void *dev, size_t bytes)
{
	assert_int_equal(kva__cuda_sync(), 0);
	assert_int_equal(kva__cuda_copy(host, dev, bytes, 0), 0);
}

static float out_at(const void *out, enum kva_dtype t, size_t i)
{
	return t == KVA_F16 ? kva_f16_to_f32(((const uint16_t *)out)[i])
	       : t == KVA_BF16 ? kva_bf16_to_f32(((const uint16_t *)out)[i])
	       : ((const float *)out)[i];
}

/* one cache, its table, and the same on the device */
struct gpu_case {
	enum kva_dtype dt, q_dt;
	int32_t heads, group, dim, page_size;
};

static const int32_t case_lens[] = { 0, 1, 17, 300, 1100 };
#define N_SEQ 5

static void run_gpu_case(const struct gpu_case *gc, uint64_t seed)
{
	const int32_t H = gc->heads, D = gc->dim, P = gc->page_size, Hq = H * gc->group;
	const size_t esize = kva_dtype_size(gc->dt), qsize = kva_dtype_size(gc->q_dt);
	uint64_t rng = seed;
	int32_t indptr[N_SEQ + 1] = { 0 }, last[N_SEQ], *indices, pages = 0, tokens = 0;
	struct kva_kv_desc kv = { 0 }, dkv;
	struct kva_page_table pt, dpt;
	struct kva_decode_opts opts = { .split_tokens = 256 };
	size_t bytes, scale_floats, nq = (size_t)N_SEQ * Hq * D;
	int64_t *slots;
	float *kin, *vin, *qf, *lse = malloc(sizeof(float) * N_SEQ * Hq);
	float *glse = malloc(sizeof(float) * N_SEQ * Hq);
	void *q = malloc(nq * qsize), *out = malloc(nq * qsize), *gout = malloc(nq * qsize);
	void *gback = malloc(nq * qsize);
	void *hk, *hv, *dk, *dv, *dks = NULL, *dvs = NULL, *dq, *dout, *dlse, *dindptr, *dind;
	void *dlast, *dslots, *dkin, *dvin, *back;
	float *hks = NULL, *hvs = NULL;
	uint32_t errors;

	for (int32_t b = 0; b < N_SEQ; b++) {
		int32_t n = (case_lens[b] + P - 1) / P;

		indptr[b + 1] = indptr[b] + n;
		last[b] = n ? case_lens[b] - (n - 1) * P : 0;
		tokens += case_lens[b];
	}
	pages = indptr[N_SEQ] + 2;
	if (pages % 7 == 0) /* i * 7 + 1 mod pages must be a permutation */
		pages++;
	indices = malloc(sizeof(int32_t) * (size_t)indptr[N_SEQ]);
	for (int32_t i = 0; i < indptr[N_SEQ]; i++) /* no two tokens share a slot */
		indices[i] = (int32_t)(((int64_t)i * 7 + 1) % pages);

	/* NHD, a padded page */
	kv.head_stride = D;
	kv.token_stride = (int64_t)H * D;
	kv.page_stride = kv.token_stride * P + 8;
	kv.num_kv_heads = H;
	kv.head_dim = D;
	kv.dtype = gc->dt;
	kv.page_size = P;
	kv.num_pages = pages;
	bytes = (size_t)kv.page_stride * pages * esize;
	hk = malloc(bytes);
	hv = malloc(bytes);
	memset(hk, 0xff, bytes);
	memset(hv, 0xff, bytes);
	scale_floats = gc->dt == KVA_INT8 ? (size_t)pages * P * H : (size_t)H;
	if (gc->dt == KVA_FP8_E4M3 || gc->dt == KVA_INT8) {
		hks = malloc(sizeof(float) * scale_floats);
		hvs = malloc(sizeof(float) * scale_floats);
		for (size_t i = 0; i < scale_floats; i++) {
			hks[i] = gc->dt == KVA_INT8 ? NAN : 0.01f * (float)(1 + i % 3);
			hvs[i] = gc->dt == KVA_INT8 ? NAN : 0.02f * (float)(1 + i % 2);
		}
		if (gc->dt == KVA_INT8) {
			kv.scale_page_stride = (int64_t)P * H;
			kv.scale_token_stride = H;
			kv.scale_head_stride = 1;
		}
		dks = dev_dup(hks, sizeof(float) * scale_floats);
		dvs = dev_dup(hvs, sizeof(float) * scale_floats);
	}
	dk = dev_dup(hk, bytes);
	dv = dev_dup(hv, bytes);
	dkv = kv;
	kv.k = hk, kv.v = hv, kv.k_scale = hks, kv.v_scale = hvs;
	dkv.k = dk, dkv.v = dv, dkv.k_scale = dks, dkv.v_scale = dvs;

	/* store every token (and one skipped slot) on both */
	slots = malloc(sizeof(int64_t) * ((size_t)tokens + 1));
	kin = malloc(sizeof(float) * ((size_t)tokens + 1) * H * D);
	vin = malloc(sizeof(float) * ((size_t)tokens + 1) * H * D);
	{
		int32_t t = 0;

		for (int32_t b = 0; b < N_SEQ; b++)
			for (int32_t i = 0; i < case_lens[b]; i++)
				slots[t++] = (int64_t)indices[indptr[b] + i / P] * P + i % P;
		slots[t] = -1;
	}
	for (size_t i = 0; i < ((size_t)tokens + 1) * H * D; i++) {
		kin[i] = 2.0f * frand(&rng);
		vin[i] = 2.0f * frand(&rng);
	}
	assert_int_equal(kva_store_kv(&kv, kin, vin, KVA_F32, slots, tokens + 1), 0);
	dslots = dev_dup(slots, sizeof(int64_t) * ((size_t)tokens + 1));
	dkin = dev_dup(kin, sizeof(float) * ((size_t)tokens + 1) * H * D);
	dvin = dev_dup(vin, sizeof(float) * ((size_t)tokens + 1) * H * D);
	assert_int_equal(kva_store_kv_cuda(&dkv, dkin, dvin, KVA_F32, dslots, tokens + 1, NULL), 0);
	back = malloc(bytes);
	dev_get(back, dk, bytes);
	assert_memory_equal(back, hk, bytes);
	dev_get(back, dv, bytes);
	assert_memory_equal(back, hv, bytes);
	if (gc->dt == KVA_INT8) {
		float *s = malloc(sizeof(float) * scale_floats);

		dev_get(s, dks, sizeof(float) * scale_floats);
		assert_memory_equal(s, hks, sizeof(float) * scale_floats);
		dev_get(s, dvs, sizeof(float) * scale_floats);
		assert_memory_equal(s, hvs, sizeof(float) * scale_floats);
		free(s);
	}

	/* decode on both */
	qf = malloc(sizeof(float) * nq);
	for (size_t i = 0; i < nq; i++) {
		qf[i] = frand(&rng);
		if (gc->q_dt == KVA_F16)
			((uint16_t *)q)[i] = kva_f32_to_f16(qf[i]);
		else if (gc->q_dt == KVA_BF16)
			((uint16_t *)q)[i] = kva_f32_to_bf16(qf[i]);
		else
			((float *)q)[i] = qf[i];
	}
	pt = (struct kva_page_table){ N_SEQ, P, indptr, indices, last };
	dindptr = dev_dup(indptr, sizeof(indptr));
	dind = dev_dup(indices, sizeof(int32_t) * (size_t)indptr[N_SEQ]);
	dlast = dev_dup(last, sizeof(last));
	dpt = (struct kva_page_table){ N_SEQ, P, dindptr, dind, dlast };
	dq = dev_dup(q, nq * qsize);
	assert_int_equal(kva__cuda_malloc(&dout, nq * qsize), 0);
	assert_int_equal(kva__cuda_malloc(&dlse, sizeof(float) * N_SEQ * Hq), 0);
	assert_int_equal(kva_decode(&kv, &pt, q, gc->q_dt, Hq, 1.0f / sqrtf((float)D), out, lse,
				    &opts), 0);
	assert_int_equal(kva_decode_cuda(&dkv, &dpt, dq, gc->q_dt, Hq, 1.0f / sqrtf((float)D), dout,
					 dlse, &opts, NULL), 0);
	dev_get(gout, dout, nq * qsize);
	dev_get(glse, dlse, sizeof(float) * N_SEQ * Hq);
	for (size_t h = 0; h < (size_t)N_SEQ * Hq; h++) {
		/* fp32 sums in another order and fused multiply-adds move scores by
		 * a few units in the last place, which exp2 turns into relative
		 * errors of that size; f16 / bf16 outputs may then round apart by
		 * one unit. A wrong index or a missed token errs by far more. */
		double scale = 1e-30;
		double tol = gc->q_dt == KVA_F32 ? 1e-4 : gc->q_dt == KVA_F16 ? 2e-3 : 1.6e-2;

		for (int32_t d = 0; d < D; d++)
			scale = fmax(scale, fabs(out_at(out, gc->q_dt, h * D + d)));
		for (int32_t d = 0; d < D; d++) {
			double c = out_at(out, gc->q_dt, h * D + d);
			double g = out_at(gout, gc->q_dt, h * D + d);

			if (!(fabs(c - g) <= tol * scale))
				fail_msg("%s q %s group %d dim %d: head %zu dim %d: cpu %g gpu %g",
					 kva_dtype_name(gc->dt), kva_dtype_name(gc->q_dt), gc->group, D,
					 h, d, c, g);
		}
		if (isinf(lse[h]) ? glse[h] != lse[h]
				  : !(fabs(glse[h] - lse[h]) <= 1e-4 * fmax(1, fabs(lse[h]))))
			fail_msg("lse of head %zu: cpu %g gpu %g", h, lse[h], glse[h]);
	}
	assert_int_equal(kva_cuda_take_errors(&errors), 0);
	assert_int_equal(errors, 0);

	/* a page id past the cache in sequence 3: NaN there, the rest unchanged */
	{
		int32_t bad = pages;

		assert_int_equal(kva__cuda_copy((int32_t *)dind + indptr[3] + 2, &bad, sizeof(bad), 1),
				 0);
		assert_int_equal(kva_decode_cuda(&dkv, &dpt, dq, gc->q_dt, Hq,
						 1.0f / sqrtf((float)D), dout, dlse, &opts, NULL), 0);
		dev_get(gback, dout, nq * qsize);
		dev_get(glse, dlse, sizeof(float) * N_SEQ * Hq);
		for (size_t i = 0; i < nq; i++)
			if (i / ((size_t)Hq * D) == 3)
				assert_true(isnan(out_at(gback, gc->q_dt, i)));
			else
				assert_false(isnan(out_at(gback, gc->q_dt, i)));
		assert_true(isnan(glse[3 * Hq]));
		assert_int_equal(kva_cuda_take_errors(&errors), 0);
		assert_int_equal(errors, KVA_CUDA_ERR_PAGE_ID);
	}
	/* a slot past the last page: nothing written at all */
	{
		int64_t past = (int64_t)pages * P;

		assert_int_equal(kva__cuda_copy((int64_t *)dslots + tokens, &past, sizeof(past), 1), 0);
		assert_int_equal(kva_store_kv_cuda(&dkv, dvin, dkin, KVA_F32, dslots, tokens + 1, NULL),
				 0);
		dev_get(back, dk, bytes);
		assert_memory_equal(back, hk, bytes);
		assert_int_equal(kva_cuda_take_errors(&errors), 0);
		assert_int_equal(errors, KVA_CUDA_ERR_SLOT);
	}

	kva__cuda_free(dk);
	kva__cuda_free(dv);
	kva__cuda_free(dks);
	kva__cuda_free(dvs);
	kva__cuda_free(dq);
	kva__cuda_free(dout);
	kva__cuda_free(dlse);
	kva__cuda_free(dindptr);
	kva__cuda_free(dind);
	kva__cuda_free(dlast);
	kva__cuda_free(dslots);
	kva__cuda_free(dkin);
	kva__cuda_free(dvin);
	free(hk);
	free(hv);
	free(hks);
	free(hvs);
	free(indices);
	free(slots);
	free(kin);
	free(vin);
	free(qf);
	free(q);
	free(out);
	free(gout);
	free(gback);
	free(lse);
	free(glse);
	free(back);
}

static void test_gpu_store_and_decode_match_the_cpu(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	static const enum kva_dtype q_dts[] = { KVA_F32, KVA_F16, KVA_BF16 };
	static const struct { int32_t heads, group, dim, page_size; } shapes[] = {
		{ 2, 1, 64, 16 }, { 2, 4, 128, 16 }, { 1, 8, 128, 32 }, { 1, 16, 256, 16 },
		{ 1, 64, 1024, 16 }, /* too big for shared memory: q and acc in global memory */
	};
	int avail = kva_cuda_available();

	(void)state;
	if (avail == -ENOTSUP) {
		print_message("skipped: libkvarena was built without nvcc (%s)\n", kva_errmsg());
		skip();
	}
	if (avail != 0) {
		print_message("skipped: no CUDA driver or CUDA device is present (%s)\n",
			      kva_errmsg());
		skip();
	}
	for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++)
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
			struct gpu_case gc = {
				.dt = dts[t], .q_dt = q_dts[(t + s) % 3], .heads = shapes[s].heads,
				.group = shapes[s].group, .dim = shapes[s].dim,
				.page_size = shapes[s].page_size,
			};

			run_gpu_case(&gc, 1000 + t * 10 + s);
		}
}

/*
 * A GPU arena where the driver is absent says so, by name, and leaves
 * nothing behind (ASan's leak check sees the rest); where a device is
 * present, test_gpu_arena does the real thing.
 */
static void test_gpu_arena_without_a_driver_says_why(void **state)
{
	struct kva_geometry g = { .block_tokens = 16, .layers = 2, .kv_heads = 2, .head_dim = 64,
				  .dtype = KVA_F16, .layout = KVA_LAYOUT_BLOCK_MAJOR };
	struct kva_cuda_opts cuda = { 0 };
	struct kva_arena_opts o = { .blocks = 64, .numa_node = -1, .cuda = &cuda };
	struct kva_cuda_device d;
	struct kva_arena *a = NULL;
	int ret = kva_cuda_device_query(NULL, &d);

	(void)state;
	if (ret == 0) {
		fprintf(stderr, "  a device is present (%s): test_gpu_arena --device covers it\n",
			d.name);
		skip();
	}
	assert_int_equal(ret, -ENODEV);
	assert_non_null(strstr(kva_errmsg(), "cuda:"));
	fprintf(stderr, "  kva_cuda_device_query: %s\n", kva_errmsg());
	assert_int_equal(kva_arena_create(&g, &o, &a), -ENODEV);
	assert_null(a);
	assert_non_null(strstr(kva_errmsg(), "cuda:"));
	/* options a GPU arena cannot take, refused before the driver is asked */
	o.flags = KVA_ARENA_HUGETLB;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	assert_non_null(strstr(kva_errmsg(), "host memory"));
	o.flags = 0;
	cuda.ipc = (enum kva_cuda_ipc)7;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_available_says_why_it_cannot_run),
		cmocka_unit_test(test_host_arguments_are_checked_before_the_driver),
		cmocka_unit_test(test_library_carries_sm80_sm90_cubins_and_ptx),
		cmocka_unit_test(test_gpu_store_and_decode_match_the_cpu),
		cmocka_unit_test(test_gpu_arena_without_a_driver_says_why),
	};

	return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
