/* SPDX-License-Identifier: MIT */
/*
 * pagetable.c - vLLM's padded block table to FlashInfer's CSR page table.
 */
#include <errno.h>

#include "arena_pvt.h"
#include "kernels_pvt.h"

int kva_page_table_from_block_table(const int32_t *block_table, int64_t row_stride,
				    const int32_t *seq_lens, int32_t batch, int32_t page_size,
				    int32_t *indptr, int32_t *indices, int32_t *last_page_len)
{
	int64_t n = 0;

	if (batch < 0 || page_size < 1 || row_stride < 0 || !indptr ||
	    (batch && (!block_table || !seq_lens || !last_page_len)))
		return kva__err(-EINVAL, "page table: bad argument");
	for (int32_t b = 0; b < batch; b++) {
		int64_t pages = seq_lens[b] < 0 ? -1 : ((int64_t)seq_lens[b] + page_size - 1) / page_size;

		if (pages < 0 || pages > row_stride)
			return kva__err(-EINVAL, "page table: sequence %d of %d tokens needs more "
					"than the %lld pages of a row", b, seq_lens[b],
					(long long)row_stride);
		if (n + pages > INT32_MAX)
			return kva__err(-EINVAL, "page table: more than 2^31 pages");
		n += pages;
	}
	if (n && !indices)
		return kva__err(-EINVAL, "page table: NULL indices");
	indptr[0] = 0;
	n = 0;
	for (int32_t b = 0; b < batch; b++) {
		int32_t pages = (seq_lens[b] + page_size - 1) / page_size;

		/* only the pages the sequence uses: padding is never read */
		for (int32_t i = 0; i < pages; i++)
			indices[n++] = block_table[(int64_t)b * row_stride + i];
		indptr[b + 1] = (int32_t)n;
		last_page_len[b] = pages ? seq_lens[b] - (pages - 1) * page_size : 0;
	}
	return (int)n;
}
