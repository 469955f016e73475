/* SPDX-License-Identifier: MIT */
/*
 * decode.cu - the device side of kva_decode_cuda and kva_store_kv_cuda.
 *
 * THIS CODE HAS ONLY BEEN COMPILED (nvcc, sm_80 / sm_90 cubins and
 * compute_90 PTX), NEVER RUN ON A GPU: the development machine has none.
 * tests/test_cuda.c compares it with the CPU kernels wherever a driver and
 * a device are present.
 *
 * The kernels follow the CPU path phase by phase (decode.c, tile_scalar.c,
 * store.c) and share its arithmetic through decode_math.h: the same number
 * conversions, the same log2-domain online softmax, the same split plan and
 * the same addressing, so the two cannot drift apart. They differ only in
 * the order fp32 sums are added (tree reductions across a warp).
 *
 *   kva_cuda_q      one block per (sequence, query head): qf = q * sm_scale * log2(e)
 *   kva_cuda_tile   one block per (sequence, KV head, split): K and V read
 *                   once for the whole query-head group, into shared memory
 *   kva_cuda_merge  one block per (sequence, query head): log-sum-exp merge
 *                   of the splits, out in q's dtype, lse
 *   kva_cuda_store_check, kva_cuda_store  every slot (and fp8 scale) is
 *                   checked by the first kernel before the second writes any
 *
 * The page table lives on the device, so its contents are checked here, not
 * on the host. A sequence whose indptr / last_page_len are inconsistent, or
 * one of whose page ids is out of 0..num_pages-1, reads no K/V outside the
 * cache: out-of-range pages read as zero, and every query head of that
 * sequence gets NaN in out and lse. The kernels also set bits (atomicOr) of
 * the context's error word, which kva_cuda_take_errors() reads and clears.
 */
#include "cuda_pvt.h"
#include "decode_math.h"
#include "kvarena.h"

static_assert(sizeof(kva__cuda_kv) == KVA__CUDA_KV_SIZE, "kva__cuda_kv layout");
static_assert(sizeof(kva__cuda_decode_args) == KVA__CUDA_DECODE_ARGS_SIZE, "decode args layout");
static_assert(sizeof(kva__cuda_store_args) == KVA__CUDA_STORE_ARGS_SIZE, "store args layout");
static_assert(KVA__CUDA_MAX_BLOCK_TOKENS <= 32, "the softmax gives each token a lane");

#define FULL_WARP 0xffffffffu

__device__ static float warp_max(float x)
{
	for (int o = 16; o > 0; o /= 2)
		x = kva_max(x, __shfl_xor_sync(FULL_WARP, x, o));
	return x;
}

__device__ static float warp_sum(float x)
{
	for (int o = 16; o > 0; o /= 2)
		x += __shfl_xor_sync(FULL_WARP, x, o);
	return x;
}

__device__ static float load_f(const void *p, int32_t dtype, int64_t i)
{
	switch (dtype) {
	case KVA_F16:
		return kva_f16_to_f32(((const uint16_t *)p)[i]);
	case KVA_BF16:
		return kva_bf16_to_f32(((const uint16_t *)p)[i]);
	case KVA_FP8_E4M3:
		return kva_fp8_to_f32(((const uint8_t *)p)[i]);
	case KVA_INT8:
		return (float)((const int8_t *)p)[i];
	default:
		return ((const float *)p)[i];
	}
}

__device__ static void store_f(void *p, int32_t dtype, int64_t i, float x)
{
	switch (dtype) {
	case KVA_F16:
		((uint16_t *)p)[i] = kva_f32_to_f16(x);
		break;
	case KVA_BF16:
		((uint16_t *)p)[i] = kva_f32_to_bf16(x);
		break;
	default:
		((float *)p)[i] = x;
	}
}

/* ------------------------------------------------------------ the plan */

struct seq_plan {
	int32_t len, split_len, splits;
	const int32_t *pages;
};

/*
 * Sequence @b's plan, as decode.c computes it; false if its part of the
 * page table is inconsistent (what the CPU's check refuses with -EINVAL).
 * Checking 0 <= indptr[b] <= indptr[b+1] <= indptr[batch] keeps every read
 * of indices inside the array the caller sized by indptr[batch].
 */
__device__ static bool plan_seq(const kva__cuda_decode_args &a, int32_t b, seq_plan *sp)
{
	const int32_t P = a.kv.page_size;
	int32_t p0 = a.indptr[b], p1 = a.indptr[b + 1], pages = p1 - p0;

	if (a.indptr[0] != 0 || p0 < 0 || p1 < p0 || p1 > a.indptr[a.batch])
		return false;
	if (pages) {
		int32_t last = a.last_page_len[b];

		if (!a.indices || last < 1 || last > P ||
		    (int64_t)(pages - 1) * P + last > (int64_t)INT32_MAX)
			return false;
	}
	sp->len = kva_seq_len(a.indptr, a.last_page_len, b, P);
	sp->split_len = kva_split_len(sp->len, P, a.split_tokens, a.max_splits);
	sp->splits = kva_split_count(sp->len, sp->split_len);
	sp->pages = a.indices ? a.indices + p0 : a.indices;
	return true;
}

/* ------------------------------------------------------------ phase 0 */

extern "C" __global__ void __launch_bounds__(KVA__CUDA_ROW_THREADS)
kva_cuda_q(const kva__cuda_decode_args a)
{
	const int32_t D = a.kv.head_dim;
	const int64_t base = (int64_t)blockIdx.x * D;

	for (int32_t d = threadIdx.x; d < D; d += blockDim.x)
		a.qf[base + d] = load_f(a.q, a.q_dtype, base + d) * a.q_scale;
}

/* ------------------------------------------------------------ phase 1 */

/*
 * @n tokens from @tb of the tile's KV head into rows[n][D] as fp32, their
 * scales (int8: per token; fp8: the head's; else 1) into scale[n]. Threads
 * take consecutive elements of a row, so a warp reads contiguous memory. A
 * page id out of range reads as zero and sets *bad.
 */
__device__ static void load_rows(const kva__cuda_kv &kv, const void *base, const float *scales,
				 const int32_t *pages, int32_t tb, int32_t n, int32_t h,
				 float *rows, float *scale, int *bad)
{
	const int32_t D = kv.head_dim, P = kv.page_size;

	for (int32_t idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
		int32_t i = idx / D, d = idx - i * D, tok = tb + i, page = pages[tok / P];
		float x = 0.0f;

		if (page >= 0 && page < kv.num_pages)
			x = load_f(base, kv.dtype,
				   kva_kv_index(kv.page_stride, kv.token_stride, kv.head_stride, page,
						tok % P, h) + d);
		else
			atomicOr(bad, 1);
		rows[idx] = x;
	}
	for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
		int32_t tok = tb + i, page = pages[tok / P];
		float s = 1.0f;

		if (kv.dtype == KVA_INT8)
			s = page >= 0 && page < kv.num_pages
			    ? scales[(int64_t)page * kv.scale_page_stride +
				     (int64_t)(tok % P) * kv.scale_token_stride +
				     (int64_t)h * kv.scale_head_stride]
			    : 0.0f;
		else if (kv.dtype == KVA_FP8_E4M3)
			s = scales[kv.flags & KVA_KV_SCALE_PER_TENSOR ? 0 : h];
		scale[i] = s;
	}
}

/*
 * One tile. Dynamic shared memory, in floats (T = block_tokens, G = group,
 * D = head_dim); the host sized it (cuda.c, tile_layout):
 *   rows[T][D]   K, then V, of the current tokens, dequantized
 *   p[G][T]      scores, then exp2(score - m)
 *   scale[T]     K, then V, scale of each token
 *   m[G], l[G], r[G]   the online-softmax state and the last rescale
 *   q[G][D]      if q_in_smem, else read from qf (global)
 *   acc[G][D]    if acc_in_smem, else accumulated in place in part (global)
 * Every element of acc is owned by one thread (the same idx in the
 * initialisation, the update and the copy out), so acc needs no barrier of
 * its own; the barriers order rows, p, scale and m/l/r between phases.
 */
extern "C" __global__ void __launch_bounds__(KVA__CUDA_TILE_THREADS)
kva_cuda_tile(const kva__cuda_decode_args a)
{
	extern __shared__ float smem[];
	__shared__ int bad;
	const int32_t H = a.kv.num_kv_heads, NS = a.max_splits, G = a.group;
	const int32_t D = a.kv.head_dim, T = a.block_tokens;
	const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
	const int64_t tile = blockIdx.x;
	const int32_t s = (int32_t)(tile % NS), h = (int32_t)(tile / NS % H);
	const int32_t b = (int32_t)(tile / ((int64_t)NS * H));
	seq_plan sp;

	/* the merge kernel reports a bad sequence; splits past the plan are empty slots */
	if (!plan_seq(a, b, &sp) || s >= sp.splits)
		return;

	float *part = a.part + (((int64_t)b * H + h) * NS + s) * a.part_stride;
	float *rows = smem, *p = rows + T * D, *scale = p + G * T;
	float *m = scale + T, *l = m + G, *r = l + G, *q_s = r + G;
	float *acc = a.acc_in_smem ? q_s + (a.q_in_smem ? G * D : 0) : part + 2 * G;
	const float *qg = a.qf + ((int64_t)b * a.num_q_heads + (int64_t)h * G) * D;
	const float *q = a.q_in_smem ? q_s : qg;
	const int32_t t0 = s * sp.split_len;
	const int32_t t1 = sp.len - t0 < sp.split_len ? sp.len : t0 + sp.split_len;

	if (threadIdx.x == 0)
		bad = 0;
	if (a.q_in_smem)
		for (int32_t i = threadIdx.x; i < G * D; i += blockDim.x)
			q_s[i] = qg[i];
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
	}
	for (int32_t i = threadIdx.x; i < G * D; i += blockDim.x)
		acc[i] = 0.0f;
	__syncthreads();

	for (int32_t tb = t0; tb < t1; tb += T) {
		const int32_t n = t1 - tb < T ? t1 - tb : T;

		load_rows(a.kv, a.kv.k, a.kv.k_scale, sp.pages, tb, n, h, rows, scale, &bad);
		__syncthreads();
		/* scores: a warp per (query head, token), lanes across head_dim */
		for (int32_t pair = warp; pair < G * n; pair += warps) {
			int32_t g = pair / n, i = pair - g * n;
			float dot = 0.0f;

			for (int32_t d = lane; d < D; d += 32)
				dot += q[g * D + d] * rows[i * D + d];
			dot = warp_sum(dot);
			if (lane == 0)
				p[g * T + i] = dot * scale[i];
		}
		__syncthreads();
		/* the block's maximum folds into the state: a warp per query head,
		 * a lane per token (T <= KVA__CUDA_MAX_BLOCK_TOKENS, a warp's
		 * lanes); the warps with no head load V */
		for (int32_t g = warp; g < G; g += warps) {
			float sc = lane < n ? p[g * T + lane] : -INFINITY;
			float mb = kva_max(m[g], warp_max(sc));
			float rs = kva_rescale(m[g], mb);
			float e = lane < n ? exp2f(sc - mb) : 0.0f;
			float sum = warp_sum(e);

			if (lane < n)
				p[g * T + lane] = e;
			__syncwarp();
			if (lane == 0) {
				l[g] = l[g] * rs + sum;
				m[g] = mb;
				r[g] = rs;
			}
		}
		load_rows(a.kv, a.kv.v, a.kv.v_scale, sp.pages, tb, n, h, rows, scale, &bad);
		__syncthreads();
		for (int32_t idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
			int32_t g = idx / D, d = idx - g * D;
			float x = acc[idx] * r[g];

			for (int32_t i = 0; i < n; i++)
				x += p[g * T + i] * scale[i] * rows[i * D + d];
			acc[idx] = x;
		}
		__syncthreads();
	}

	if (bad) {
		/* l = NaN tells the merge this split read a page that is not there */
		if (threadIdx.x == 0)
			atomicOr(a.errors, KVA_CUDA_ERR_PAGE_ID);
		for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
			part[g] = -INFINITY;
			part[G + g] = NAN;
		}
		return;
	}
	for (int32_t g = threadIdx.x; g < G; g += blockDim.x) {
		part[g] = m[g];
		part[G + g] = l[g];
	}
	if (a.acc_in_smem)
		for (int32_t i = threadIdx.x; i < G * D; i += blockDim.x)
			part[2 * G + i] = acc[i];
}

/* ------------------------------------------------------------ phase 2 */

/* Each thread merges the splits for its elements in split order, pairwise
 * (kva_merge_weights); decode.c's run_merge takes the largest maximum first
 * and weights each split once (kva_rescale): the same sums in exact
 * arithmetic, one multiply-add an element where a CPU core does them all. */
extern "C" __global__ void __launch_bounds__(KVA__CUDA_ROW_THREADS)
kva_cuda_merge(const kva__cuda_decode_args a)
{
	const int32_t Hq = a.num_q_heads, G = a.group, D = a.kv.head_dim, NS = a.max_splits;
	const int32_t b = (int32_t)(blockIdx.x / Hq), qh = (int32_t)(blockIdx.x % Hq);
	const int32_t h = qh / G, g = qh % G;
	const int64_t obase = (int64_t)blockIdx.x * D;
	const float *part0 = a.part + ((int64_t)b * a.kv.num_kv_heads + h) * NS * a.part_stride;
	seq_plan sp;

	if (!plan_seq(a, b, &sp)) {
		if (threadIdx.x == 0 && qh == 0)
			atomicOr(a.errors, KVA_CUDA_ERR_PAGE_TABLE);
		for (int32_t d = threadIdx.x; d < D; d += blockDim.x)
			store_f(a.out, a.q_dtype, obase + d, NAN);
		if (a.lse && threadIdx.x == 0)
			a.lse[blockIdx.x] = NAN;
		return;
	}
	for (int32_t d = threadIdx.x; d < D; d += blockDim.x) {
		float m = -INFINITY, l = 0.0f, acc = 0.0f;
		bool bad = false;

		for (int32_t s = 0; s < sp.splits; s++) {
			const float *part = part0 + s * a.part_stride;
			float mm, wa, wb;

			bad |= part[G + g] != part[G + g];
			kva_merge_weights(m, part[g], &mm, &wa, &wb);
			l = l * wa + part[G + g] * wb;
			acc = acc * wa + part[2 * G + (int64_t)g * D + d] * wb;
			m = mm;
		}
		store_f(a.out, a.q_dtype, obase + d, bad ? NAN : l > 0.0f ? acc / l : 0.0f);
	}
	if (a.lse && threadIdx.x == 0) {
		float m = -INFINITY, l = 0.0f;
		bool bad = false;

		for (int32_t s = 0; s < sp.splits; s++) {
			const float *part = part0 + s * a.part_stride;
			float mm, wa, wb;

			bad |= part[G + g] != part[G + g];
			kva_merge_weights(m, part[g], &mm, &wa, &wb);
			l = l * wa + part[G + g] * wb;
			m = mm;
		}
		a.lse[blockIdx.x] = bad ? NAN : kva_lse(m, l);
	}
}

/* ---------------------------------------------------------------- store */

/* One thread per token, and thread 0 also checks the fp8 scales: what
 * store.c checks before it writes anything. */
extern "C" __global__ void __launch_bounds__(KVA__CUDA_CHECK_THREADS)
kva_cuda_store_check(const kva__cuda_store_args a)
{
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	unsigned int err = 0;

	if (i < a.n_tokens && a.slot_mapping[i] >= (int64_t)a.kv.num_pages * a.kv.page_size)
		err |= KVA_CUDA_ERR_SLOT;
	if (i == 0 && a.kv.dtype == KVA_FP8_E4M3) {
		int32_t n = a.kv.flags & KVA_KV_SCALE_PER_TENSOR ? 1 : a.kv.num_kv_heads;

		for (int32_t h = 0; h < n; h++) {
			float ks = a.kv.k_scale[h], vs = a.kv.v_scale[h];

			if (!(ks > 0.0f) || !(vs > 0.0f) || ks > 1e30f || vs > 1e30f)
				err |= KVA_CUDA_ERR_SCALE;
		}
	}
	if (err) {
		atomicOr(a.flag, err);
		atomicOr(a.errors, err);
	}
}

/* One block per (token, KV head, K or V); threads across head_dim. */
extern "C" __global__ void __launch_bounds__(KVA__CUDA_ROW_THREADS)
kva_cuda_store(const kva__cuda_store_args a)
{
	__shared__ float warp_amax[KVA__CUDA_ROW_THREADS / 32];
	const kva__cuda_kv &kv = a.kv;
	const int32_t i = blockIdx.x, h = blockIdx.y, is_v = blockIdx.z, D = kv.head_dim;
	const int64_t slot = a.slot_mapping[i];
	const int64_t src = ((int64_t)i * kv.num_kv_heads + h) * D;
	const void *in = is_v ? a.v : a.k;
	float *scales = (float *)(is_v ? kv.v_scale : kv.k_scale);
	char *base = (char *)(is_v ? kv.v : kv.k);
	int32_t page, off;
	int64_t e;

	/* store_check ran before on the same stream: a bad call writes nothing */
	if (*(volatile uint32_t *)a.flag || slot < 0)
		return;
	page = (int32_t)(slot / kv.page_size);
	off = (int32_t)(slot % kv.page_size);
	e = kva_kv_index(kv.page_stride, kv.token_stride, kv.head_stride, page, off, h);

	switch (kv.dtype) {
	case KVA_F32:
	case KVA_F16:
	case KVA_BF16:
		for (int32_t d = threadIdx.x; d < D; d += blockDim.x)
			store_f(base, kv.dtype, e + d, load_f(in, a.in_dtype, src + d));
		break;
	case KVA_FP8_E4M3: {
		float inv = 1.0f / scales[kv.flags & KVA_KV_SCALE_PER_TENSOR ? 0 : h];

		for (int32_t d = threadIdx.x; d < D; d += blockDim.x) {
			float x = load_f(in, a.in_dtype, src + d);

			((uint8_t *)base)[e + d] = kva_f32_to_fp8(x * inv);
		}
		break;
	}
	case KVA_INT8: {
		float amax = 0.0f, scale, inv;

		for (int32_t d = threadIdx.x; d < D; d += blockDim.x)
			amax = kva_max(amax, fabsf(load_f(in, a.in_dtype, src + d)));
		amax = warp_max(amax);
		if (threadIdx.x % 32 == 0)
			warp_amax[threadIdx.x / 32] = amax;
		__syncthreads();
		amax = 0.0f;
		for (int32_t w = 0; w < (int32_t)blockDim.x / 32; w++)
			amax = kva_max(amax, warp_amax[w]);
		scale = amax / 127.0f;
		inv = scale > 0.0f ? 1.0f / scale : 0.0f;
		for (int32_t d = threadIdx.x; d < D; d += blockDim.x) {
			float x = load_f(in, a.in_dtype, src + d);

			((int8_t *)base)[e + d] = kva_f32_to_i8(x, inv);
		}
		if (threadIdx.x == 0)
			scales[(int64_t)page * kv.scale_page_stride +
			       (int64_t)off * kv.scale_token_stride +
			       (int64_t)h * kv.scale_head_stride] = scale;
		break;
	}
	}
}
