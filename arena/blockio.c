/* SPDX-License-Identifier: MIT */
/*
 * blockio.c - a block's contents as bytes, wherever the arena lives: its
 * pieces in canonical order, and copies in and out of them. On host memory
 * a copy is memcpy; on a GPU arena it is a driver copy (devmem.c), because
 * the CPU must not touch device memory.
 */
#include <errno.h>
#include <string.h>

#include "arena_pvt.h"
#include "devmem_pvt.h"

/*
 * The pieces of a layer-major block number 2 x layers (x 2 with scales);
 * they are computed on the fly rather than stored, one at a time.
 */
bool kva__block_piece_at(const struct kva_arena_info *info, uint32_t block, uint32_t i,
			 struct kva__piece *p)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	uint32_t pages = 2 * g->layers;

	if (l->block_stride) {
		if (i)
			return false;
		p->off = kva_kv_offset(g, l, info->blocks, block, 0, 0, 0);
		p->len = l->block_bytes;
		return true;
	}
	if (i < pages) {
		p->off = kva_kv_offset(g, l, info->blocks, block, i / 2, (int)(i % 2), 0);
		p->len = l->page_bytes;
		return true;
	}
	i -= pages;
	if (!l->scale_bytes || i >= pages)
		return false;
	p->off = kva_kv_offset(g, l, info->blocks, block, i / 2, (int)(i % 2), 1);
	p->len = l->scale_bytes;
	return true;
}

int kva__block_copy(struct kva_arena *a, uint32_t to, uint32_t from)
{
	struct kva__piece pt, pf = { 0 }; /* the same geometry: set whenever pt is */
	int ret;

	for (uint32_t i = 0; kva__block_piece_at(&a->info, to, i, &pt); i++) {
		kva__block_piece_at(&a->info, from, i, &pf);
		if (!a->dev)
			memcpy(a->data + pt.off, a->data + pf.off, pt.len);
		else if ((ret = kva__dev_copy_within(a->dev, pt.off, pf.off, pt.len)) < 0)
			return ret;
	}
	return 0;
}

/* @len bytes at @offset of block @id's contents, piece by piece: to @buf
 * (@out) or from it */
static int block_io(struct kva_worker *w, uint32_t id, uint64_t offset, void *buf, size_t len,
		    bool out)
{
	struct kva_arena *a;
	struct kva__piece p;
	uint8_t *b = buf;
	int ret;

	if (!w || (!buf && len))
		return kva__err(-EINVAL, "block io: NULL argument");
	a = w->arena;
	if (id >= a->blocks || offset > a->info.layout.block_bytes ||
	    len > a->info.layout.block_bytes - offset)
		return kva__err(-EINVAL, "block io: block %u bytes %llu..+%zu (%u blocks of %llu "
				"bytes)", id, (unsigned long long)offset, len, a->blocks,
				(unsigned long long)a->info.layout.block_bytes);
	if (!a->data)
		return kva__err(-EINVAL, "block io: the data region is not mapped here");
	for (uint32_t i = 0; len && kva__block_piece_at(&a->info, id, i, &p); i++) {
		uint64_t n;

		if (offset >= p.len) {
			offset -= p.len;
			continue;
		}
		n = p.len - offset < len ? p.len - offset : len;
		if (!a->dev)
			memcpy(out ? b : a->data + p.off + offset, out ? a->data + p.off + offset : b,
			       n);
		else if ((ret = out ? kva__dev_read(a->dev, b, p.off + offset, n)
				    : kva__dev_write(a->dev, p.off + offset, b, n)) < 0)
			return ret;
		b += n;
		len -= n;
		offset = 0;
	}
	return 0;
}

int kva_block_read(struct kva_worker *w, uint32_t id, uint64_t offset, void *dst, size_t len)
{
	return block_io(w, id, offset, dst, len, true);
}

int kva_block_write(struct kva_worker *w, uint32_t id, uint64_t offset, const void *src,
		    size_t len)
{
	return block_io(w, id, offset, (void *)src, len, false);
}
