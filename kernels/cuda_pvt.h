/* SPDX-License-Identifier: MIT */
/*
 * cuda_pvt.h - what the CUDA host side (cuda.c, C) and the device kernels
 * (decode.cu, compiled by nvcc as C++) agree on: the kernels' names, their
 * block sizes, and the one argument struct each kernel takes by value.
 *
 * The structs hold only fixed-width integers, floats and pointers, in an
 * order without padding surprises, so the C compiler and nvcc lay them out
 * alike; cuLaunchKernel copies them into the kernel's parameter space as
 * bytes. Every pointer in them is a device pointer.
 */
#ifndef KVA_CUDA_PVT_H
#define KVA_CUDA_PVT_H

#include <stddef.h>
#include <stdint.h>

/* kernel names in the module (extern "C" in decode.cu, so unmangled) */
#define KVA__CUDA_FN_Q "kva_cuda_q"
#define KVA__CUDA_FN_TILE "kva_cuda_tile"
#define KVA__CUDA_FN_MERGE "kva_cuda_merge"
#define KVA__CUDA_FN_STORE_CHECK "kva_cuda_store_check"
#define KVA__CUDA_FN_STORE "kva_cuda_store"

/* threads per block; the tile kernel is compiled with this launch bound */
#define KVA__CUDA_TILE_THREADS 256
#define KVA__CUDA_ROW_THREADS 128   /* q, merge and store: one block per row */
#define KVA__CUDA_CHECK_THREADS 256 /* store_check: one thread per token */
/* tokens a tile scores per softmax update: a warp's lanes take one each */
#define KVA__CUDA_MAX_BLOCK_TOKENS 32

/* The KV descriptor as the kernels read it (struct kva_kv_desc, flattened). */
struct kva__cuda_kv {
	const void *k, *v;
	const float *k_scale, *v_scale;
	int64_t page_stride, token_stride, head_stride;
	int64_t scale_page_stride, scale_token_stride, scale_head_stride;
	int32_t num_kv_heads, head_dim, page_size, num_pages;
	int32_t dtype;          /* enum kva_dtype */
	uint32_t flags;         /* KVA_KV_* */
};

/*
 * One decode call. The tile kernel runs one block per (sequence, KV head,
 * split slot): grid = batch * num_kv_heads * max_splits, and a block whose
 * split slot is past its sequence's split count returns at once. The plan
 * of each sequence is computed on the device from the device page table
 * with decode_math.h, as the CPU computes it, so nothing is copied back.
 */
struct kva__cuda_decode_args {
	struct kva__cuda_kv kv;
	const int32_t *indptr, *indices, *last_page_len;
	const void *q;          /* [batch][num_q_heads][head_dim], q_dtype */
	void *out;              /* same shape and dtype */
	float *lse;             /* [batch][num_q_heads] or NULL */
	float *qf;              /* scratch [batch][num_q_heads][head_dim]: q * q_scale */
	float *part;            /* scratch [batch][num_kv_heads][max_splits][part_stride] */
	uint32_t *errors;       /* the context's KVA_CUDA_ERR_* word (cuda.c, struct module) */
	int64_t part_stride;    /* group * (2 + head_dim): m[group], l[group], acc[group][D] */
	int32_t batch, num_q_heads, group;
	int32_t split_tokens, max_splits;
	int32_t q_dtype;        /* enum kva_dtype: f32, f16, bf16 */
	float q_scale;          /* sm_scale * log2(e) */
	int32_t block_tokens;   /* tokens per softmax update, 1..KVA__CUDA_MAX_BLOCK_TOKENS */
	int32_t q_in_smem;      /* 1: the group's q is copied to shared memory */
	int32_t acc_in_smem;    /* 1: acc lives in shared memory, else in part */
};

/* One store call: store_check sets *flag, store writes only if it is 0. */
struct kva__cuda_store_args {
	struct kva__cuda_kv kv;
	const void *k, *v;      /* [n_tokens][num_kv_heads][head_dim], in_dtype */
	const int64_t *slot_mapping;
	uint32_t *flag;         /* scratch word, zeroed before store_check */
	uint32_t *errors;       /* the context's KVA_CUDA_ERR_* word */
	int32_t n_tokens;
	int32_t in_dtype;       /* enum kva_dtype: f32, f16, bf16 */
};

/* Both compilers assert these sizes (cuda.c, decode.cu): a field added on
 * one side only, or laid out differently, fails the build instead of
 * passing the kernels shifted arguments. */
#define KVA__CUDA_KV_SIZE 104
#define KVA__CUDA_DECODE_ARGS_SIZE 224
#define KVA__CUDA_STORE_ARGS_SIZE 152

#ifndef __CUDACC__
/*
 * kva__cuda_fatbin - the module libkvarena carries (nvcc's fatbin: sm_80 and
 * sm_90 cubins, compute_90 PTX), and its size in *len; NULL and 0 when the
 * library was built without nvcc.
 */
const void *kva__cuda_fatbin(size_t *len);

/*
 * Device memory for tests and tools, in the calling thread's current context
 * (device 0's primary context if none is current): what kva_decode_cuda needs
 * its caller to have. Each returns 0 or a negative errno (-ENODEV without a
 * driver, -ENOMEM, -EIO for another driver failure; kva_errmsg() says which).
 * kva__cuda_copy is synchronous; @to_device picks the direction.
 */
int kva__cuda_malloc(void **dptr, size_t bytes);
int kva__cuda_free(void *dptr);
int kva__cuda_copy(void *dst, const void *src, size_t bytes, int to_device);
int kva__cuda_sync(void);
#endif

#endif /* KVA_CUDA_PVT_H */
