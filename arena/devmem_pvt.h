/* SPDX-License-Identifier: MIT */
/*
 * devmem_pvt.h - a GPU data region as one process has it mapped (devmem.c).
 *
 * The creator (the agent) makes it: the device's primary context retained,
 * one range of device addresses reserved, chunks of cuMemCreate mapped over
 * it in order and exported as POSIX fds (KVA_IPC_FD), or one cuMemAlloc
 * shared by a cuIpcMemHandle (KVA_IPC_LEGACY). An importer (a worker) finds
 * the device by UUID, reserves a range of its own, and maps each chunk from
 * its fd as the fds arrive, releasing each imported handle once mapped (the
 * mapping holds the memory); access is set once, over the whole range, at
 * the end. Every call runs with the device's primary context pushed and
 * popped around it, so a caller's own current context is never changed.
 *
 * Nothing of this lives in shared memory: what importers need to know
 * (device UUID, granularity, chunk sizes) is in the arena's header, which
 * its creator checksums (arena_pvt.h).
 *
 * The CPU never touches device memory here: copies go through the driver.
 */
#ifndef KVA_DEVMEM_PVT_H
#define KVA_DEVMEM_PVT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvarena.h"

struct kva__dev;
struct kva__dev_queue;

/* What the arena's header records of a region (struct kva__header). */
struct kva__dev_geom {
	uint32_t ipc;             /* KVA_IPC_FD or KVA_IPC_LEGACY */
	uint64_t granularity;     /* recommended; 0: legacy without VMM */
	uint64_t chunk_bytes;     /* every chunk's size but maybe the last's */
	uint32_t chunks;
	uint64_t map_bytes;       /* the whole range */
	uint64_t total_bytes;     /* the device's memory */
	uint8_t uuid[16];
	char name[64];
};

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of @uuid into @out (48 bytes). */
void kva__dev_uuid_str(const uint8_t uuid[16], char out[48]);

/* the size of chunk @i of @g */
static inline uint64_t kva__dev_chunk_size(const struct kva__dev_geom *g, uint32_t i)
{
	uint64_t off = (uint64_t)i * g->chunk_bytes;

	return g->map_bytes - off < g->chunk_bytes ? g->map_bytes - off : g->chunk_bytes;
}

/* ---------------------------------------------------------- the creator */

/*
 * kva__dev_create - a region of at least @data_bytes on the device @o names,
 * zeroed (as a fresh memfd is), mapped read-write here. *@g says what it is.
 * Return: 0, -ENODEV, -ENOTSUP, -ENOMEM, -EINVAL (a bad option), -EIO;
 * kva_errmsg() names the driver call. On failure nothing is left behind.
 */
int kva__dev_create(const struct kva_cuda_opts *o, uint64_t data_bytes, struct kva__dev_geom *g,
		    struct kva__dev **out);

/* the creator's exported chunk fds (KVA_IPC_FD; they stay its own), and its
 * IPC handle (KVA_IPC_LEGACY: CU_IPC_HANDLE_SIZE bytes) */
const int *kva__dev_fds(const struct kva__dev *d);
const void *kva__dev_ipc_handle(const struct kva__dev *d);

/* ---------------------------------------------------------- an importer */

/*
 * kva__dev_import_begin - for a region @g says: the device found by UUID,
 * its primary context retained, the range reserved (KVA_IPC_FD). Then
 * kva__dev_import_fd for chunks 0, 1, ... in order (the caller keeps and
 * closes the fds) or kva__dev_import_ipc once, then kva__dev_import_end.
 * Return: 0, -ENODEV (no driver, or the device is not visible here),
 * -ENOMEM, -EIO, -EPROTO (a chunk out of order).
 */
int kva__dev_import_begin(const struct kva__dev_geom *g, struct kva__dev **out);
int kva__dev_import_fd(struct kva__dev *d, uint32_t chunk, int fd);
int kva__dev_import_ipc(struct kva__dev *d, const void *handle);
int kva__dev_import_end(struct kva__dev *d);

/* where an importer spent its time (kva_attach_times): ns */
struct kva__dev_times {
	uint64_t driver_ns, reserve_ns, import_ns, map_ns, access_ns;
};
void kva__dev_times(const struct kva__dev *d, struct kva__dev_times *t);

/* -------------------------------------------------------------- either */

/* the region's first byte in this process (a device pointer), or 0 */
uint64_t kva__dev_base(const struct kva__dev *d);

/* unmap, free the range (or close, free the IPC memory), release the
 * context; NULL is ignored */
void kva__dev_close(struct kva__dev *d);

/* the device's memory now (cuMemGetInfo); -EIO */
int kva__dev_mem_info(struct kva__dev *d, uint64_t *free_bytes, uint64_t *total_bytes);

/* host memory made pinned for the device's copies (cuMemHostRegister,
 * portable), and let go */
int kva__dev_host_register(struct kva__dev *d, void *p, size_t bytes);
void kva__dev_host_unregister(struct kva__dev *d, void *p);

/* copies between host memory and the region at byte @off (cuMemcpyHtoD,
 * cuMemcpyDtoH), and within the region, all complete on return (the legacy
 * stream waited for where the driver returns early); -EIO */
int kva__dev_read(struct kva__dev *d, void *dst, uint64_t off, uint64_t len);
int kva__dev_write(struct kva__dev *d, uint64_t off, const void *src, uint64_t len);
int kva__dev_copy_within(struct kva__dev *d, uint64_t dst_off, uint64_t src_off, uint64_t len);

/*
 * A queue of copies of one thread (a stream of its own): enqueue, then wait
 * for all. A queue whose copy failed refuses more until the wait, which
 * returns the first failure. Used by one thread at a time.
 */
int kva__dev_queue_open(struct kva__dev *d, struct kva__dev_queue **q);
void kva__dev_queue_close(struct kva__dev_queue *q);
int kva__dev_queue_to_host(struct kva__dev_queue *q, void *dst, uint64_t off, uint64_t len);
int kva__dev_queue_from_host(struct kva__dev_queue *q, uint64_t off, const void *src,
			     uint64_t len);
int kva__dev_queue_wait(struct kva__dev_queue *q);

#endif /* KVA_DEVMEM_PVT_H */
