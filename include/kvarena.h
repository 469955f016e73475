/* SPDX-License-Identifier: MIT */
/*
 * kvarena.h - the public interface of libkvarena.
 *
 * A kvarena arena is a pool of fixed-size KV-cache blocks that lives in two
 * shared memory regions (metadata and data) and is used by many processes at
 * once. Each process maps the regions at its own address; everything shared is
 * addressed by block ids and offsets.
 *
 * Conventions:
 *   - int functions return 0 (or a count where said) or a negative errno and
 *     never touch errno. kva_errmsg() gives a sentence about the last failure
 *     of this thread (set by the slow paths: create, open, join, reclaim...).
 *   - No function aborts on bad input.
 *   - A struct kva_worker is used by one thread at a time. A process may join
 *     several workers (one per thread, say).
 */
#ifndef KVARENA_H
#define KVARENA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_VERSION_MAJOR 0
#define KVA_VERSION_MINOR 1

/*
 * Workers per arena. A shared block records its holders as one bit per worker
 * slot inside its 64-bit descriptor, so taking or dropping a reference is a
 * single compare-and-swap that a crash cannot tear; 48 bits are left for it.
 */
#define KVA_MAX_WORKERS 48u

/* Largest block count: block ids must fit the int32 page tables of kernels. */
#define KVA_MAX_BLOCKS 0x7fffffffu

/* ---------------------------------------------------------------- geometry */

enum kva_dtype {
	KVA_F32 = 1,
	KVA_F16 = 2,
	KVA_BF16 = 3,
	KVA_FP8_E4M3 = 4,
	KVA_INT8 = 5, /* with one float scale per token and head, stored in the block */
};

enum kva_layout {
	/* One block is one contiguous span holding every layer's K and V (and
	 * int8 scales): a spill or fetch of a block is one I/O. */
	KVA_LAYOUT_BLOCK_MAJOR = 0,
	/* Per-layer pools: layer l's K pages of all blocks are contiguous, then
	 * its V pages; the shape vLLM and FlashInfer allocate per layer. */
	KVA_LAYOUT_LAYER_MAJOR = 1,
};

/*
 * The shape of one block. Inside one layer's K (or V) page the order is
 * [kv_head][token][head_dim] (FlashInfer's HND): the tokens of one head are
 * contiguous, so a decode kernel streams them.
 */
struct kva_geometry {
	uint32_t block_tokens; /* tokens per block, 1..65536 */
	uint32_t layers;       /* 1..4096 */
	uint32_t kv_heads;     /* 1..4096 */
	uint32_t head_dim;     /* 1..65536 */
	enum kva_dtype dtype;
	enum kva_layout layout;
};

/*
 * Where things are, in bytes, computed from a geometry and a block count.
 * kva_kv_offset() gives the offset of one layer's K (kv = 0) or V (kv = 1) page
 * of one block; the strides below hold inside such a page. Pages and scale
 * arrays start on 64-byte boundaries; block-major blocks on 4 KiB boundaries
 * (so a block can be written to an O_DIRECT file as it is).
 */
struct kva_block_layout {
	uint32_t elem_bytes;     /* bytes per element of dtype */
	uint64_t page_bytes;     /* bytes one layer's K (or V) page of one block occupies */
	uint64_t page_stride;    /* bytes from block b's page to block b+1's, same layer and kv */
	uint64_t head_stride;    /* bytes between heads inside a page */
	uint64_t token_stride;   /* bytes between tokens inside a head */
	uint64_t scale_bytes;    /* int8: bytes one layer's K (or V) scales of one block occupy, else 0 */
	uint64_t scale_stride;   /* int8: bytes from block b's scales to block b+1's */
	uint64_t block_bytes;    /* bytes of one block: all layers, K, V and scales */
	uint64_t block_stride;   /* block-major: bytes between blocks; layer-major: 0 */
	uint64_t pool_bytes;     /* layer-major: bytes of one layer's K (or V) pool; else 0 */
	uint64_t data_bytes;     /* size of the data region for the block count */
};

/*
 * kva_geometry_layout - validate a geometry and compute its layout.
 * @g:      the geometry
 * @blocks: number of blocks (1..KVA_MAX_BLOCKS)
 * @out:    filled on success
 * Return: 0, or -EINVAL (a field out of range, kva_errmsg() names it) or
 * -EOVERFLOW (the sizes do not fit 64 bits).
 */
int kva_geometry_layout(const struct kva_geometry *g, uint32_t blocks,
			struct kva_block_layout *out);

/*
 * kva_kv_offset - byte offset in the data region of layer @layer's K (@kv = 0) or
 * V (@kv = 1) page of block @block; with @scales set, of that page's int8 scales.
 * Arguments are not checked: callers pass values inside the geometry.
 */
uint64_t kva_kv_offset(const struct kva_geometry *g, const struct kva_block_layout *l,
		       uint32_t blocks, uint32_t block, uint32_t layer, int kv, int scales);

size_t kva_dtype_size(enum kva_dtype t);       /* 0 for an unknown dtype */
const char *kva_dtype_name(enum kva_dtype t);  /* "f16"...; "?" when unknown */
int kva_dtype_parse(const char *s, enum kva_dtype *out); /* -EINVAL if unknown */

/* ------------------------------------------------------------------ arena */

struct kva_arena;
struct kva_worker;

#define KVA_ARENA_HUGETLB 0x1u /* back data with 2 MiB huge pages when the system has them */

/* Where the data region lives: host memory (a memfd), or a GPU's memory. */
enum kva_backend { KVA_BACKEND_HOST = 0, KVA_BACKEND_CUDA = 1 };

/* How a GPU data region is shared with workers (kva_cuda_opts.ipc). */
enum kva_cuda_ipc {
	KVA_IPC_AUTO = 0,   /* FD where the device can export POSIX fds, else LEGACY */
	KVA_IPC_FD = 1,     /* chunks of cuMemCreate, exported as POSIX fds (the VMM API) */
	/* one cuMemAlloc of the whole region, shared with cuIpcGetMemHandle:
	 * one allocation, because the kernels address the arena as one tensor
	 * and cuIpcOpenMemHandle puts each allocation where it likes */
	KVA_IPC_LEGACY = 2,
};

/* Chunks of one GPU data region, at most (each is passed as a file descriptor). */
#define KVA_MAX_CHUNKS 4096u

/*
 * The data region on a GPU (kva_arena_opts.cuda); the metadata stays in
 * host shared memory. The region is one range of device virtual addresses
 * mapping chunks of cuMemCreate, each a multiple of the device's
 * recommended granularity; every worker maps the same chunks, in the same
 * order, over a range of its own (kva_attach). The creator keeps its own
 * mapping, and the physical memory lives until the last process unmaps it.
 */
struct kva_cuda_opts {
	const char *device;    /* an ordinal ("0") or a UUID ("GPU-8f6d...", or an
				* unambiguous prefix of one); NULL = "0" */
	uint64_t chunk_bytes;  /* rounded up to the granularity; 0 = 512 MiB. Raised
				* when the region would need more than KVA_MAX_CHUNKS */
	enum kva_cuda_ipc ipc;
};

/*
 * What one CUDA device is (kva_cuda_device_query). uuid in nvidia-smi's
 * form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": workers find the
 * arena's device by it, since ordinals change with CUDA_VISIBLE_DEVICES.
 */
struct kva_cuda_device {
	int ordinal;                      /* as this process sees it */
	char name[64];
	char uuid[48];
	uint64_t total_bytes, free_bytes; /* cuMemGetInfo, in its primary context */
	uint64_t granularity;             /* recommended for cuMemCreate; 0 without VMM */
	int vmm;                          /* cuMemCreate and friends supported */
	int posix_fd;                     /* VMM memory exportable as POSIX fds */
	int rdma;                         /* GPUDirect RDMA with VMM memory */
};

/*
 * kva_cuda_device_query - the device @device names (an ordinal or a UUID, as
 * kva_cuda_opts.device; NULL = "0"). It retains the device's primary context
 * for the query (creating it if no one has: some hundred MiB of device
 * memory, for the moment of the call). Return: 0, -ENODEV (no driver, or no
 * such device; kva_errmsg() says which), -EIO (a driver failure).
 */
int kva_cuda_device_query(const char *device, struct kva_cuda_device *out);

struct kva_arena_opts {
	uint32_t blocks;       /* number of blocks, required */
	uint32_t max_workers;  /* worker slots, 1..KVA_MAX_WORKERS; 0 = KVA_MAX_WORKERS */
	uint32_t cache_blocks; /* per-worker cache capacity; 0 = 1/64 of the
				* blocks, at most 256, none below 8;
				* KVA_CACHE_NONE disables */
	uint32_t flags;        /* KVA_ARENA_* */
	int32_t numa_node;     /* bind the data region to this node; -1 = no binding */
	const char *name;      /* shown by ops tools; NULL = "kvarena" */
	uint64_t tier_keys;    /* keys of blocks in the tiers below the arena the
				* prefix index must hold besides its own blocks
				* (the agent: its tiers' record count); 0 = none */
	const struct kva_cuda_opts *cuda; /* the data region on a GPU; NULL = host
					   * memory. numa_node and HUGETLB are for
					   * host memory only */
};

#define KVA_CACHE_NONE 0xffffffffu

/* What an arena is; fixed for its life. */
struct kva_arena_info {
	struct kva_geometry geometry;
	struct kva_block_layout layout;
	uint32_t blocks;
	uint32_t max_workers;
	uint32_t cache_blocks;  /* default per-worker cache capacity, 0 = none */
	int hugetlb;            /* 1 if the data region is on huge pages */
	int32_t numa_node;      /* -1 if not bound */
	uint64_t meta_bytes;    /* metadata region size */
	uint64_t alloc_meta_bytes; /* of it, what the allocator keeps per block:
				    * descriptors and free-block summary */
	uint64_t index_entries;  /* prefix index capacity (kvarena_seq.h) */
	uint64_t tier_keys;      /* of them, room kept for the tiers' keys (kvarena_tiers.h) */
	char name[32];
	/* the data region's home. On KVA_BACKEND_CUDA, block pointers
	 * (kva_block_data, kva_block_kv, kva_kv_desc_for_arena) are device
	 * pointers, which the CPU must not touch (kva_block_read and
	 * kva_block_write copy), and the rest says where they are */
	enum kva_backend backend;
	enum kva_cuda_ipc ipc;       /* KVA_IPC_FD or KVA_IPC_LEGACY */
	char device_name[64];
	char device_uuid[48];        /* "GPU-..." */
	uint64_t device_total_bytes;
	uint64_t granularity;        /* the device's recommended granularity (0: legacy
				      * on a device without VMM) */
	uint64_t chunk_bytes;        /* bytes of each chunk; the last may be shorter */
	uint32_t chunks;
	uint64_t data_map_bytes;     /* the range mapped: data_bytes rounded up to the
				      * granularity */
};

/*
 * kva_arena_create - make a new arena in two fresh sealed memfds.
 * Return: 0, -EINVAL (bad geometry or options; kva_errmsg() says which),
 * -ENOMEM, or the errno of a failed memfd_create/ftruncate/mmap/mbind.
 * Huge pages are used when asked and available, else ordinary pages
 * (kva_arena_info() tells which). With @o->cuda the data region is device
 * memory instead (kva_arena_data_fd() is then -EMEDIUMTYPE), and the errors
 * add -ENODEV (no driver, no such device), -ENOTSUP (the device cannot share
 * memory the way @o->cuda->ipc says), -ENOMEM (device memory) and -EIO
 * (another driver failure); kva_errmsg() names the driver call and its
 * CUresult. Nothing is left reserved, mapped or allocated after a failure.
 */
int kva_arena_create(const struct kva_geometry *g, const struct kva_arena_opts *o,
		     struct kva_arena **out);

/*
 * kva_arena_open - map an existing host-memory arena from its two region fds, in any
 * process, at any address. The fds are duplicated; the caller keeps its own.
 * Every header field is validated; nothing in the region is trusted.
 * Return: 0, -EBADF (fds not usable), -EBADMSG (not a kvarena region, corrupt
 * header, sizes or seals wrong; kva_errmsg() names the field),
 * -EPROTONOSUPPORT (another ABI version), -EMEDIUMTYPE (the arena's data is
 * on a GPU: its chunks come from the agent, kva_attach), or a failed mmap's
 * errno.
 */
int kva_arena_open(int meta_fd, int data_fd, struct kva_arena **out);

#define KVA_OPEN_READONLY 0x1u /* map both regions PROT_READ: stats, map, check only */

/*
 * kva_arena_open_flags - kva_arena_open() with KVA_OPEN_* flags. A read-only
 * mapping (what the agent gives ops tools) refuses join, adopt and reclaim
 * with -EROFS; a read-only fd needs KVA_OPEN_READONLY. A read-only opener
 * of a GPU arena passes -1 for @data_fd and maps the metadata alone.
 */
int kva_arena_open_flags(int meta_fd, int data_fd, unsigned flags, struct kva_arena **out);

/* kva_arena_close - unmap; workers joined through @a must have left. */
void kva_arena_close(struct kva_arena *a);

const struct kva_arena_info *kva_arena_info(const struct kva_arena *a);
int kva_arena_meta_fd(const struct kva_arena *a);
int kva_arena_data_fd(const struct kva_arena *a);

/* --------------------------------------------------------------- workers */

/*
 * kva_worker_join - take a worker slot in the arena for this process.
 * @name: shown by ops tools (truncated to 31 bytes); NULL = "worker".
 * Return: 0, -EINVAL, -EUSERS (every slot taken), -ENOMEM.
 */
int kva_worker_join(struct kva_arena *a, const char *name, struct kva_worker **out);

/*
 * kva_worker_leave - give back the slot: the worker's cache returns to the
 * arena, and so does every block and reference it still holds (the handle is
 * the only way to free them). NULL is ignored.
 */
void kva_worker_leave(struct kva_worker *w);

/*
 * Slots handed out by an agent: kva_arena_reserve_slot() marks a free slot
 * JOINING for process @pid (a process killed from then on is reclaimable),
 * that process completes it with kva_worker_adopt(), and a reservation
 * nobody adopted can be taken back with kva_arena_release_slot(). kva_attach()
 * does all this through the agent; these are for the agent's side.
 * Return: 0, -EINVAL, -EUSERS (no free slot), -ESTALE (not reserved for the
 * calling process, or taken back), -EBUSY (adopted), -EROFS.
 */
int kva_arena_reserve_slot(struct kva_arena *a, pid_t pid, uint32_t *slot, uint32_t *generation);
int kva_worker_adopt(struct kva_arena *a, uint32_t slot, uint32_t generation, const char *name,
		     struct kva_worker **out);
int kva_arena_release_slot(struct kva_arena *a, uint32_t slot, uint32_t generation);

enum kva_agent_state {
	KVA_AGENT_NONE = 0,     /* an embedded arena, or no agent yet */
	KVA_AGENT_RUNNING = 1,
	KVA_AGENT_STOPPING = 2, /* new allocations and references fail: -ESHUTDOWN */
};

/* kva_arena_set_agent - the agent (the calling process) announces its state. */
int kva_arena_set_agent(struct kva_arena *a, enum kva_agent_state state);
/* kva_arena_agent - the state the agent last announced, and its pid. */
enum kva_agent_state kva_arena_agent(const struct kva_arena *a, int32_t *pid);

/* A slot as the agent's own table has it (it decides from that table, never
 * from the slot words workers can write). */
enum kva_agent_slot_state {
	KVA_AGENT_SLOT_FREE = 0,
	KVA_AGENT_SLOT_RESERVED = 1,        /* for an admitted process, not adopted yet */
	KVA_AGENT_SLOT_ATTACHED = 2,        /* an admitted worker */
	KVA_AGENT_SLOT_JOINED = 3,          /* a worker that joined on its own, watched */
	KVA_AGENT_SLOT_RECLAIM_PENDING = 4, /* its process exited; the reclaim is retried */
	KVA_AGENT_SLOT_AGENT = 5,           /* the agent's own (its tier thread's holds) */
};

struct kva_agent_report {
	uint64_t repairs;          /* words the agent found overwritten and put back */
	char last_repair[128];     /* the last one, in a line ("" if none) */
	uint32_t reclaims_pending; /* dead workers whose reclaim is being retried */
	uint32_t max_workers;
	/* a GPU arena: the device's memory as the agent last read it
	 * (cuMemGetInfo, once a second); 0 for host memory */
	uint64_t device_free_bytes, device_total_bytes;
	struct kva_agent_slot {
		uint32_t state;        /* enum kva_agent_slot_state */
		uint32_t generation;
		int32_t pid;
		uint32_t uid;
		uint32_t pending_ms;   /* how long its reclaim has been retried */
	} slots[KVA_MAX_WORKERS];
};

/*
 * kva_arena_agent_report - what the agent that owns @a reports: its slot
 * table, repairs and pending reclaims, as it last wrote them (every 100 ms).
 * All zero for an arena without an agent. Return: 0 or -EINVAL.
 */
int kva_arena_agent_report(const struct kva_arena *a, struct kva_agent_report *r);

int kva_worker_slot(const struct kva_worker *w);        /* slot index, or -EINVAL */
struct kva_arena *kva_worker_arena(const struct kva_worker *w);

/*
 * kva_worker_set_cache - change this worker's cache capacity (0 = no cache).
 * Blocks above the new capacity go back to the arena.
 * Return: 0, -EINVAL (above 65536), -ENOMEM, -ESTALE (slot reclaimed).
 */
int kva_worker_set_cache(struct kva_worker *w, uint32_t blocks);

/*
 * kva_alloc - take @n blocks exclusively; their ids go to @ids.
 * All or nothing: on failure no block is taken.
 * Return: 0, -ENOSPC (fewer than @n free blocks outside worker caches; this
 * worker's own cache is returned to the arena first), -EINVAL, -ESTALE (this
 * worker's slot was reclaimed: it must not be used any more).
 */
#ifndef KVA__LIBRARY_BUILD
static inline
#endif
int kva_alloc(struct kva_worker *w, uint32_t n, uint32_t *ids);

/*
 * kva_free - drop one reference per id (an exclusive block has one).
 * A block is free when its last reference anywhere is dropped.
 * All or nothing: every id is checked before anything changes; an id may
 * repeat as long as the worker holds that many references.
 * Return: 0, -EINVAL (id out of range, or NULL), -EPERM (not held: a double
 * free, a block of another worker, or a free block), -ESTALE (slot reclaimed).
 */
#ifndef KVA__LIBRARY_BUILD
static inline
#endif
int kva_free(struct kva_worker *w, const uint32_t *ids, uint32_t n);

/*
 * kva_alloc_slow / kva_free_slow - the out-of-line whole of kva_alloc() and
 * kva_free(), same contract; the inline versions call them when the worker's
 * cache cannot answer. Also what to bind from other languages (the library
 * exports kva_alloc and kva_free symbols as well).
 */
int kva_alloc_slow(struct kva_worker *w, uint32_t n, uint32_t *ids);
int kva_free_slow(struct kva_worker *w, const uint32_t *ids, uint32_t n);

/*
 * kva_share - take one more reference per id.
 * A block held exclusively by this worker becomes shared (the worker then
 * holds two references). A block shared by any worker gains this worker as a
 * holder. A block another worker holds exclusively cannot be referenced until
 * that worker shares it (-EPERM): that is what lets a worker's own blocks
 * and cache work without atomic instructions.
 * All or nothing. Return: 0, -EINVAL, -EPERM, -EOVERFLOW (2^30 references
 * on one block from one worker), -ESTALE.
 */
int kva_share(struct kva_worker *w, const uint32_t *ids, uint32_t n);

/*
 * kva_block_data - address of block @id in this process: for block-major, the
 * whole block_bytes span; for layer-major, its layer-0 K page (use kva_block_kv).
 * On a GPU arena a device pointer. NULL if @id is out of range.
 */
void *kva_block_data(struct kva_worker *w, uint32_t id);

/* kva_block_kv - layer @layer's K and V pages of block @id (device pointers on
 * a GPU arena). -EINVAL on bad ids. */
int kva_block_kv(struct kva_worker *w, uint32_t id, uint32_t layer, void **k, void **v);

/*
 * kva_block_read, kva_block_write - copy @len bytes out of, or into, block @id
 * from byte @offset of its contents, wherever the arena lives: memcpy on host
 * memory, a synchronous cuMemcpy on a GPU arena (the calling thread's work
 * on the device is not waited for: synchronize the streams that write the
 * block first). A block's contents are its bytes in canonical order: every
 * layer's K page then V page, layer by layer, then (int8) every layer's K
 * scales then V scales; for block-major that is the block's span as it lies.
 * They neither check nor take ownership. Return: 0, -EINVAL (a bad id, or
 * the range passes block_bytes), -EIO (the copy failed; kva_errmsg() says
 * why).
 */
int kva_block_read(struct kva_worker *w, uint32_t id, uint64_t offset, void *dst, size_t len);
int kva_block_write(struct kva_worker *w, uint32_t id, uint64_t offset, const void *src,
		    size_t len);

/* ------------------------------------------------------------------ stats */

enum kva_slot_state {
	KVA_SLOT_FREE = 0,
	KVA_SLOT_JOINING = 1,
	KVA_SLOT_LIVE = 2,
	KVA_SLOT_RECLAIMING = 3,
};

struct kva_slot_stats {
	uint32_t slot;
	uint32_t state;        /* enum kva_slot_state */
	uint32_t generation;   /* bumped when the slot is reclaimed or left */
	int32_t pid;
	char name[32];
	uint32_t owned;        /* blocks held exclusively (cache included) */
	uint32_t shared;       /* shared blocks this slot holds (however many references) */
	uint32_t cached;       /* blocks in its private cache, as of its last call
				* that reached the arena (a cache hit publishes nothing) */
	uint64_t refills;      /* batches taken from the arena into its cache */
	uint64_t flushes;      /* batches its cache gave back */
	uint64_t shares;       /* references taken */
};

struct kva_stats {
	uint32_t total_blocks;
	uint32_t free_blocks;
	uint32_t used_blocks;   /* owned + shared */
	uint32_t owned_blocks;  /* held by one worker (its cache included) */
	uint32_t shared_blocks;
	uint32_t shared_refs;   /* sum over shared blocks of their holder count */
	uint32_t cached_blocks; /* sum of the workers' published cache sizes */
	uint32_t workers;       /* slots joined (joining, live or being reclaimed) */
	uint32_t max_workers;
	uint32_t prefix_cached_blocks; /* published prefix blocks nobody holds:
					* evictable, counted in neither free nor used */
	struct kva_slot_stats slots[KVA_MAX_WORKERS]; /* index = slot */
};

/* kva_arena_slot - one slot's state, generation and pid (holder, or reclaimer
 * while RECLAIMING), from one load. -EINVAL for no such slot. */
int kva_arena_slot(const struct kva_arena *a, uint32_t slot, enum kva_slot_state *state,
		   uint32_t *generation, int32_t *pid);

/*
 * kva_stats / kva_arena_stats - counts from one pass over the descriptors
 * (O(blocks), no locks; a snapshot that concurrent calls may be moving through).
 */
int kva_stats(struct kva_worker *w, struct kva_stats *st);
int kva_arena_stats(struct kva_arena *a, struct kva_stats *st);

/*
 * kva_arena_map - the block map: one character per block (or, when @cells is
 * smaller than the block count, per run of blocks, showing its most common
 * state), NUL-terminated. '.' free, '#' shared, '+' cached prefix, the slot's character
 * (kva_slot_char) for a block one slot holds, '!' a descriptor naming no live
 * slot or undecodable. @len must be at least cells + 1.
 * Return: the number of cells written, or -EINVAL.
 */
int kva_arena_map(struct kva_arena *a, char *buf, size_t len, uint32_t cells);
char kva_slot_char(uint32_t slot);   /* '0'-'9', 'a'-'z', 'A'-'L' */

/*
 * kva_arena_map_print - the map wrapped at @width characters (0 = 64), at
 * most @rows rows (0 = one character per block), then a legend naming the
 * live slots. Return: 0, -EINVAL, -ENOMEM or -EIO.
 */
int kva_arena_map_print(struct kva_arena *a, FILE *f, uint32_t width, uint32_t rows);

/*
 * One block as ops tools draw it (kvarena-ctl map --svg): its state judged
 * as kva_arena_map judges it (one classifier for both), its holders, and
 * the pinned hint. A picture, read without locks from memory any worker
 * can write: never a reason to touch a block.
 */
enum kva_block_kind {
	KVA_BLOCK_FREE = 0,     /* '.' */
	KVA_BLOCK_OWNED = 1,    /* held by one worker alone, its cache included: the slot's char */
	KVA_BLOCK_SHARED = 2,   /* '#': held by references of one or more workers */
	KVA_BLOCK_CACHED = 3,   /* '+': a published prefix block nobody holds (evictable) */
	KVA_BLOCK_DEMOTING = 4, /* 'v': published, held by the agent's tier thread copying it below */
	KVA_BLOCK_FETCHING = 5, /* '^': the destination of a fetch from a tier below */
	KVA_BLOCK_BAD = 6,      /* '!': names no joined slot, or undecodable: corrupt or stale */
};

#define KVA_BLOCK_PINNED 0x1u    /* held, and pinned sequences hold it (a hint: .pins) */
#define KVA_BLOCK_PUBLISHED 0x2u /* the prefix index may name it (cached ones always) */

struct kva_block_state {
	uint8_t kind;          /* enum kva_block_kind */
	uint8_t flags;         /* KVA_BLOCK_PINNED, KVA_BLOCK_PUBLISHED */
	uint8_t slot;          /* OWNED: the owner; SHARED, DEMOTING, FETCHING: the lowest
				* holder; else 255 */
	uint8_t holders;       /* slots holding it (OWNED: 1; FREE, CACHED, BAD: 0) */
	uint16_t epoch;        /* the descriptor's epoch: bumped each time the block is freed */
	uint16_t pins;         /* references of pinned sequences, as the hint says
				* (saturated at 65535); 0 unless KVA_BLOCK_PINNED */
	uint64_t holder_mask;  /* bit s: slot s holds it */
};

/*
 * kva_arena_block_states - the state of blocks @first .. @first + @n - 1
 * (clipped at the arena's end) into @out[0 ..], one descriptor read each:
 * a snapshot that concurrent workers may be moving through, as
 * kva_arena_map. A descriptor naming a slot that is not joined is read
 * again against the slot words before it is called KVA_BLOCK_BAD.
 * KVA_BLOCK_PINNED is a hint (the pins count of struct kva__bmeta, arena
 * private): set while a pinned sequence (KVA_OWNER_PINNED) holds the
 * block; one whose pinned holder died may stay pinned until the block is
 * freed or evicted. Works on an observer's read-only mapping.
 * Return: the number of blocks written (0 when @first is the block count),
 * or -EINVAL (@a or @out NULL, @first past the block count).
 */
int kva_arena_block_states(const struct kva_arena *a, uint32_t first, uint32_t n,
			   struct kva_block_state *out);

/* --------------------------------------------------------------- recovery */

struct kva_reclaim_report {
	uint32_t slot;
	int32_t pid;             /* the process that held the slot */
	char name[32];
	uint32_t owned_freed;    /* exclusive blocks returned (its cache included) */
	uint32_t shared_dropped; /* shared blocks it held (however many references) */
	uint32_t shared_freed;   /* of those, blocks it was the last holder of */
	uint32_t shared_cached;  /* of those, published blocks it was the last holder
				  * of: cached now, not freed */
	uint32_t hints_repaired; /* free blocks made findable again */
	uint64_t elapsed_ns;
};

/*
 * kva_arena_reclaim - return everything slot @slot held (its cache included)
 * once its process is gone (its whole thread group exited), and bump the
 * slot generation so that any tag the old holder left can never be taken for
 * the new one's. Safe while other workers run, from any number of threads and
 * processes at once: one of them reclaims, the others get -EBUSY.
 * Restartable: if the reclaimer dies, another call finishes the job.
 * Return: 0, -EINVAL (no such slot), -ENOENT (slot not in use), -EBUSY (its
 * process is alive, or another thread or process is reclaiming it), -EROFS.
 */
int kva_arena_reclaim(struct kva_arena *a, uint32_t slot, struct kva_reclaim_report *r);

struct kva_check_report {
	uint32_t free_blocks, owned_blocks, shared_blocks, shared_refs;
	uint32_t bad_descriptors; /* kind or bits no valid descriptor has */
	uint32_t stale_owners;    /* owned by a slot that is free or of another generation */
	uint32_t dead_holders;    /* shared holder bits of slots that are not joined */
	uint32_t hints_missing;   /* free blocks the allocator cannot find */
	uint32_t dead_slots;      /* joined slots whose process is gone, not yet reclaimed:
				   * information, not a breach (reclaim is the fix) */
	int64_t first_bad_block;  /* -1 if none */
	uint32_t cached_blocks;   /* published prefix blocks nobody holds (evictable) */
	uint32_t index_bad;       /* index entries naming a published block under
				   * another key, published blocks no entry names, or
				   * entries naming a free or private block of their life */
	uint32_t published_blocks; /* cached, or shared and published */
	uint64_t published_count;  /* the count the cache limit is held against, with
				    * each slot's operation in flight settled */
	uint32_t published_bad;    /* 1 if published_count != published_blocks */
	char first_problem[160];   /* the first breach found, in one line: what is
				    * wrong and where; "" if none */
};

/*
 * kva_arena_check - verify the global invariant: every block is exactly one of
 * free (and findable), owned by one joined slot of the current generation, or
 * shared with holders that are all joined slots (refcount = holders, by
 * construction); every published block is named by an index entry under the
 * key it was published with, and no entry names another key's publication;
 * the published-block count is the number of published blocks.
 * Exact when no worker is inside an arena call.
 * Return: 0 if it holds, -EUCLEAN if not (the report says what, and
 * kva_errmsg() gives the counts and the first problem in one line).
 */
int kva_arena_check(struct kva_arena *a, struct kva_check_report *r);

/* ------------------------------------------------------------------ agent */

/*
 * A worker attaches to the arena of a kvarena-agent through its Unix socket.
 * NULL as the path means kva_default_socket(): $KVARENA_SOCKET if set, else
 * KVA_DEFAULT_SOCKET.
 */
#define KVA_DEFAULT_SOCKET "/run/kvarena/kvarena.sock"
const char *kva_default_socket(void);

/*
 * kva_attach - connect to the agent, get a slot and the arena's regions, map
 * them: after this every arena call works without talking to the agent.
 * Return: 0; -ENOENT or -ECONNREFUSED (no agent there), -EACCES (refused by
 * the socket's mode or the agent's uid/gid policy), -EUSERS (no free slot),
 * -EDQUOT (over the agent's slots per process or per user, or too many
 * connections waiting), -EPROTONOSUPPORT (another protocol version), -EPERM,
 * -ESHUTDOWN (the agent is stopping), -EPROTO (a malformed answer, or a
 * @name that is not printable UTF-8 of at most 31 bytes), -ETIMEDOUT.
 * kva_errmsg() has the agent's reason.
 *
 * If the agent dies, the worker's mapping and everything in it keep working:
 * alloc, free, share, block data, stats, and leave. What stops: admission of
 * new workers, and reclaim of workers that die after the agent (their blocks
 * stay held until the arena's last process closes it). kva_worker_poll()
 * says -ECONNRESET then.
 */
int kva_attach(const char *socket_path, const char *name, struct kva_worker **out);

/* kva_detach - leave (cache and all holdings back), tell the agent, unmap. */
void kva_detach(struct kva_worker *w);

/*
 * kva_worker_fd - the agent connection of an attached worker, to watch for
 * readability in the caller's event loop; kva_worker_poll() then says what
 * came: 0 nothing, -ESHUTDOWN the agent is stopping (free and detach; new
 * allocations already fail with -ESHUTDOWN), -ECONNRESET the agent is gone.
 * -EINVAL for a worker that did not attach.
 */
int kva_worker_fd(const struct kva_worker *w);
int kva_worker_poll(struct kva_worker *w);

/*
 * Where kva_attach spent its time, in ns, part by part: what
 * `kvarena-bench attach` reports. The GPU parts are 0 for a host arena.
 */
struct kva_attach_times {
	uint64_t connect_ns;  /* socket and connect */
	uint64_t welcome_ns;  /* HELLO sent, WELCOME read */
	uint64_t meta_ns;     /* the regions opened and the header checked (a GPU
			       * arena: the metadata alone) */
	uint64_t driver_ns;   /* libcuda loaded (once a process), the device found by
			       * UUID, its primary context retained */
	uint64_t reserve_ns;  /* cuMemAddressReserve of the whole range */
	uint64_t recv_ns;     /* the chunk messages read */
	uint64_t import_ns;   /* cuMemImportFromShareableHandle of each chunk (legacy:
			       * cuIpcOpenMemHandle) */
	uint64_t map_ns;      /* cuMemMap and cuMemRelease of each chunk */
	uint64_t access_ns;   /* cuMemSetAccess over the range */
	uint64_t adopt_ns;    /* the slot adopted, ADOPTED sent */
	uint64_t total_ns;    /* the whole kva_attach */
	uint32_t chunks;      /* GPU chunks mapped */
	uint32_t messages;    /* chunk messages read */
};

/* kva_worker_attach_times - the parts of @w's kva_attach. -EINVAL if @w did not attach. */
int kva_worker_attach_times(const struct kva_worker *w, struct kva_attach_times *t);

struct kva_agent_info {
	int32_t pid;
	char arena[32];
};

/*
 * kva_observe - a read-only mapping of the agent's arena, for ops tools: no
 * slot, no connection kept. Stats, map and check work on it.
 */
int kva_observe(const char *socket_path, struct kva_arena **out, struct kva_agent_info *info);

/*
 * kva_sizeof - sizeof(struct @type) as this library was built ("kva_stats"
 * or "struct kva_stats"), for bindings that lay the public structs out
 * themselves and must refuse a library of another layout; 0 for a name
 * that is not a public struct.
 */
size_t kva_sizeof(const char *type);

/* ------------------------------------------------------- inline fast path */

/*
 * The first member of every struct kva_worker: the worker's private cache of
 * blocks it owns, which is all the inline kva_alloc() and kva_free() touch.
 * It belongs to the library and may change with KVA_VERSION_MAJOR; it is in
 * this header only so that a cache hit costs no call (as DPDK's mempool
 * cache). Private memory of one worker: no atomics.
 */
struct kva_worker_cache {
	uint32_t *ids;            /* [0, len): owned blocks that no one holds */
	uint32_t *held;           /* per block: KVA__HELD_EXCL, a count of shared references, or 0 */
	/* size_t, not uint32_t: a store of a block id (uint32_t) cannot change
	 * them, so a compiler may keep them in registers */
	size_t len, cap;
	size_t blocks;
};
#define KVA__HELD_EXCL 0x80000000u

static inline int kva__alloc_inline(struct kva_worker *w, uint32_t n, uint32_t *ids)
{
	struct kva_worker_cache *c = (struct kva_worker_cache *)w;

	/* n - 1 < len: 1 <= n <= len; n == 0 takes the slow path */
	if (__builtin_expect(w && ids && n - 1u < c->len, 1)) {
		uint32_t len = c->len - n;

		for (uint32_t k = 0; k < n; k++) {
			uint32_t id = c->ids[len + k];

			ids[k] = id;
			c->held[id] = KVA__HELD_EXCL;
		}
		c->len = len;
		return 0;
	}
	return kva_alloc_slow(w, n, ids);
}

static inline int kva__free_inline(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	struct kva_worker_cache *c = (struct kva_worker_cache *)w;

	/* 1 <= n <= room left in the cache (the slow path, when the cache is
	 * full, sends blocks back to the arena, all of them if it is short) */
	if (__builtin_expect(w && ids && n - 1u < c->cap - c->len, 1)) {
		uint32_t *top = c->ids + c->len;
		uint32_t k;

		/* all ours alone? clearing as we go also catches an id twice;
		 * each id goes above the cache's top as it is checked, loaded
		 * once (read again after the store to held[], which may alias
		 * ids[] as far as the compiler knows, a get+put pair took
		 * 1.03-1.16x as long on Zen 3: doc/figures.md, thirteenth session) */
		for (k = 0; k < n; k++) {
			uint32_t id = ids[k];

			if (__builtin_expect(id >= c->blocks || c->held[id] != KVA__HELD_EXCL, 0))
				break;
			c->held[id] = 0;
			top[k] = id;
		}
		if (__builtin_expect(k == n, 1)) {
			c->len += n;
			return 0;
		}
		while (k--) /* not all: undo, and let the slow path say why */
			c->held[ids[k]] = KVA__HELD_EXCL;
	}
	return kva_free_slow(w, ids, n);
}

#ifndef KVA__LIBRARY_BUILD
static inline int kva_alloc(struct kva_worker *w, uint32_t n, uint32_t *ids)
{
	return kva__alloc_inline(w, n, ids);
}

static inline int kva_free(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	return kva__free_inline(w, ids, n);
}
#endif

/* ------------------------------------------------------------------ misc */

/* kva_errmsg - the last failure of this thread, as a sentence ("" if none). */
const char *kva_errmsg(void);

#ifdef __cplusplus
}
#endif

#include "kvarena_kernels.h"
#include "kvarena_seq.h"
#include "kvarena_tiers.h"

#endif /* KVARENA_H */
