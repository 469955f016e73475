/* SPDX-License-Identifier: MIT */
/*
 * cudastub.c - a TEST-ONLY STAND-IN for the CUDA driver, built as
 * libcuda.so.1 in the test tree and never installed. Tests put its
 * directory first on LD_LIBRARY_PATH so that kvarena's loader
 * (arena/cudrv.c) finds it on machines without a GPU.
 *
 * It serves the driver API kvarena uses, over host memory, and runs no
 * kernels. Device memory is a memfd, so it is shared between processes the
 * way the real driver's is; a device pointer is an address in the process,
 * which the CPU may touch only where the real API would allow a device to
 * (cuMemSetAccess), and the stand-in's own copies go through a private
 * read-write alias of the memory. Only cuGetProcAddress and
 * cuGetProcAddress_v2 are exported; every other entry point is had through
 * them by its base name, with the ABI of CUDA 12.0 (cudastub_pvt.h).
 *
 * What makes it worth having is that it holds its callers to the real
 * API's documented contract wherever it can tell: cuInit first, a current
 * and retained context, allocation properties, sizes and addresses in
 * whole granules, offset 0 in cuMemMap, access set before memory is
 * touched, unmapping before cuMemAddressFree, whole mappings to cuMemUnmap,
 * handles released once, copies only into memory that is mapped and
 * accessible, and more (each check says which rule it is). A breach
 * returns the driver's error, prints one line
 * "cudastub[pid]: contract: <function>: <what was wrong>", and is counted.
 * At exit it reports what the process left behind and how many breaches
 * it made.
 *
 * Environment, read once, at cuInit:
 *   KVA_CUDASTUB_DEVICES      physical devices, 1..8 (1)
 *   KVA_CUDASTUB_MEMORY       bytes per device, K/M/G suffixes (8G)
 *   KVA_CUDASTUB_GRANULARITY  minimum allocation granularity, a power of
 *                             two >= 4096 (2M); recommended is twice it
 *   KVA_CUDASTUB_RDMA         GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (1)
 *   CUDA_VISIBLE_DEVICES      as the real driver reads it: ordinals or
 *                             "GPU-" UUID prefixes; the list ends at the
 *                             first entry naming no (new) device
 *   KVA_CUDASTUB_NO_CPU=1     device memory is never CPU-accessible in this
 *                             process (copies still work): a CPU touch of
 *                             device memory is a SIGSEGV
 *   KVA_CUDASTUB_FAIL         failures to inject: a comma list of name
 *                             (every call) or name:N (the Nth), see fails[]
 *   KVA_CUDASTUB_STRICT=1     at exit, _exit(88) after any contract breach,
 *                             else _exit(87) if anything was left behind
 *   KVA_CUDASTUB_LOG=1        one stderr line per call
 *
 * A live handle holds a memfd; a mapping holds its memory without one, as
 * the driver's do.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudrv_pvt.h"
#include "cudastub_pvt.h"

#define EXPORT __attribute__((visibility("default")))

#define DRIVER_VERSION 13000
#define MAX_DEVICES 8
#define CTX_STACK_DEPTH 32
/* table sizes: far beyond what a test makes; running out is
 * CU_ERROR_OUT_OF_MEMORY, as a real driver's limits are */
#define MAX_ALLOCS 16384 /* below 1 << 16: the index is a handle's low 16 bits */
#define MAX_RESERVATIONS 4096
#define MAX_MAPPINGS 16384
#define MAX_LINEARS 4096
#define MAX_HOST_REGS 1024
#define MAX_STREAMS 1024

/* cuda.h's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: special handles any
 * async call may be given, like NULL */
#define STREAM_LEGACY ((cu_stream)0x1)
#define STREAM_PER_THREAD ((cu_stream)0x2)
/* CU_MEMHOSTREGISTER_IOMEMORY, which cudrv_pvt.h does not need */
#define HOST_REGISTER_IOMEMORY 0x04
/* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the per-thread default
 * stream is the stand-in's only stream semantics anyway */
#define GET_PROC_PER_THREAD_STREAM 0x2

/* ---------------------------------------------------------- reporting */

static const struct {
	cu_result value;
	const char *name, *text;
} results[] = {
	{ CU_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CU_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ CU_ERROR_NOT_A_DRIVER, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library" },
	{ CU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CU_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
	{ CU_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
	  "OS call failed or operation not supported on this OS" },
	{ CU_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CU_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
	  "the operation cannot be performed in the present state" },
	{ CU_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CU_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	  "an illegal memory access was encountered" },
	{ CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	  "part or all of the requested memory range is already mapped" },
	{ CU_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	  "pointer does not correspond to a registered memory region" },
	{ CU_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ CU_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
};

static const char *result_name(cu_result r)
{
	for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (results[i].value == r)
			return results[i].name;
	return "CUDA_ERROR_UNKNOWN";
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* one line on stderr, written at once so that the lines of processes
 * sharing a stderr do not interleave */
static void say(const char *fmt, ...)
{
	char line[768];
	int len = snprintf(line, sizeof(line), "cudastub[%d]: ", (int)getpid());
	ssize_t written;
	va_list ap;

	va_start(ap, fmt);
	len += vsnprintf(line + len, sizeof(line) - len, fmt, ap);
	va_end(ap);
	if (len > (int)sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	written = write(STDERR_FILENO, line, len);
	(void)written;
}

/* breaches of the contract: under report_lock (taken after tables_lock
 * where both are held) */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned violations;
static char first_violation[384];

static void arm_exit_check(void);

static cu_result contract(const char *fn, cu_result err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * contract - the caller broke a documented rule of the API in @fn: say
 * what, count it, and return @err, the error the driver gives for it.
 */
static cu_result contract(const char *fn, cu_result err, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	say("contract: %s: %s", fn, what);
	/* a process that breaks the contract before cuInit still fails STRICT */
	arm_exit_check();
	pthread_mutex_lock(&report_lock);
	if (!violations++)
		snprintf(first_violation, sizeof(first_violation), "%s: %.256s", fn, what);
	pthread_mutex_unlock(&report_lock);
	return err;
}

/* ------------------------------------------------------ configuration */

/*
 * Read from the environment once (config_once, at the first cuInit), then
 * only read. config_read and initialized are stored with release after
 * cfg and the failure table are written; every reader of those first loads
 * one of the two with acquire.
 */
static struct {
	int devices;                   /* physical */
	int visible[MAX_DEVICES];      /* the program's ordinal -> physical */
	int visible_count;
	size_t memory;                 /* per device */
	size_t granularity;            /* the minimum; recommended is twice it */
	bool rdma, no_cpu, log;
	bool vmm_unsupported, export_unsupported; /* KVA_CUDASTUB_FAIL specials */
} cfg;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static atomic_bool config_read;
static atomic_bool initialized; /* a cuInit succeeded */

/* KVA_CUDASTUB_FAIL: what each name fails, and with which result */
enum fail_kind {
	FAIL_CREATE, FAIL_IMPORT, FAIL_EXPORT, FAIL_RESERVE, FAIL_MAP, FAIL_ACCESS, FAIL_ALLOC,
	FAIL_IPC_GET, FAIL_IPC_OPEN, FAIL_MEMCPY, FAIL_HOST_REGISTER, FAIL_INIT, FAIL_GETINFO,
	FAIL_UNSUPPORTED, /* the specials' calls, for their count */
	FAIL_KINDS
};

#define FAIL_NTH_MAX 8

static struct {
	const char *name;
	cu_result result;
	bool every;
	unsigned nth[FAIL_NTH_MAX], nths;
	atomic_uint calls;             /* calls of the kind so far */
} fails[FAIL_KINDS] = {
	[FAIL_CREATE] = { .name = "create", .result = CU_ERROR_OUT_OF_MEMORY },
	[FAIL_IMPORT] = { .name = "import", .result = CU_ERROR_OPERATING_SYSTEM },
	[FAIL_EXPORT] = { .name = "export", .result = CU_ERROR_NOT_SUPPORTED },
	[FAIL_RESERVE] = { .name = "reserve", .result = CU_ERROR_OUT_OF_MEMORY },
	[FAIL_MAP] = { .name = "map", .result = CU_ERROR_OUT_OF_MEMORY },
	[FAIL_ACCESS] = { .name = "access", .result = CU_ERROR_INVALID_VALUE },
	[FAIL_ALLOC] = { .name = "alloc", .result = CU_ERROR_OUT_OF_MEMORY },
	[FAIL_IPC_GET] = { .name = "ipc_get", .result = CU_ERROR_INVALID_VALUE },
	[FAIL_IPC_OPEN] = { .name = "ipc_open", .result = CU_ERROR_MAP_FAILED },
	[FAIL_MEMCPY] = { .name = "memcpy", .result = CU_ERROR_ILLEGAL_ADDRESS },
	[FAIL_HOST_REGISTER] = { .name = "host_register", .result = CU_ERROR_NOT_PERMITTED },
	[FAIL_INIT] = { .name = "init", .result = CU_ERROR_NO_DEVICE },
	[FAIL_GETINFO] = { .name = "getinfo", .result = CU_ERROR_INVALID_CONTEXT },
	[FAIL_UNSUPPORTED] = { .name = NULL, .result = CU_ERROR_NOT_SUPPORTED },
};

/*
 * inject - the call @fn of @kind, which has passed the contract checks:
 * CU_SUCCESS, or the result KVA_CUDASTUB_FAIL asks this one to fail with.
 * Every call counts, so "create:2" is the second cuMemCreate that got this
 * far.
 */
static cu_result inject(enum fail_kind kind, const char *fn)
{
	unsigned n = atomic_fetch_add_explicit(&fails[kind].calls, 1, memory_order_relaxed) + 1;
	bool fail = fails[kind].every;

	for (unsigned i = 0; i < fails[kind].nths; i++)
		fail |= fails[kind].nth[i] == n;
	if (!fail)
		return CU_SUCCESS;
	say("injected: %s #%u -> %s", fn, n, result_name(fails[kind].result));
	return fails[kind].result;
}

/* vmm:unsupported or export:unsupported turned @fn off */
static cu_result unsupported(const char *fn, const char *special)
{
	unsigned n = atomic_fetch_add_explicit(&fails[FAIL_UNSUPPORTED].calls, 1,
					       memory_order_relaxed) + 1;

	say("injected: %s #%u -> CUDA_ERROR_NOT_SUPPORTED (%s)", fn, n, special);
	return CU_ERROR_NOT_SUPPORTED;
}

static bool env_flag(const char *name, bool dflt)
{
	const char *s = getenv(name);

	if (!s || !*s)
		return dflt;
	return strcmp(s, "0") != 0;
}

/* a byte count with an optional K, M, G or T suffix; 0 if it is none */
static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return 0;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	}
	if (*end || v > (SIZE_MAX >> shift))
		return 0;
	return (size_t)v << shift;
}

static size_t env_size(const char *name, size_t dflt, bool power_of_two, size_t min)
{
	const char *s = getenv(name);
	size_t v;

	if (!s || !*s)
		return dflt;
	v = parse_size(s);
	if (v >= min && (!power_of_two || !(v & (v - 1))))
		return v;
	say("%s=%s is not %s >= %zu; using %zu", name, s,
	    power_of_two ? "a power of two" : "a size", min, dflt);
	return dflt;
}

static void device_uuid(int physical, cu_uuid *uuid)
{
	static const char prefix[8] = { 'k', 'v', 'a', 's', 't', 'u', 'b', '-' };

	memset(uuid, 0, sizeof(*uuid));
	memcpy(uuid->bytes, prefix, sizeof(prefix));
	uuid->bytes[15] = (char)physical;
}

/* "GPU-6b766173-7475-622d-0000-0000000000pp", as nvidia-smi writes it */
static void device_uuid_string(int physical, char *buf, size_t len)
{
	cu_uuid uuid;
	unsigned char b[16];

	device_uuid(physical, &uuid);
	memcpy(b, uuid.bytes, sizeof(b));
	snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
		 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* the physical device a CUDA_VISIBLE_DEVICES entry names, or -1 */
static int device_named(const char *entry)
{
	size_t len = strlen(entry);
	int found = -1;

	if (len && strspn(entry, "0123456789") == len) {
		long ordinal = len < 4 ? strtol(entry, NULL, 10) : MAX_DEVICES;

		return ordinal < cfg.devices ? (int)ordinal : -1;
	}
	if (len <= 4 || strncmp(entry, "GPU-", 4))
		return -1;
	for (int p = 0; p < cfg.devices; p++) {
		char uuid[48];

		device_uuid_string(p, uuid, sizeof(uuid));
		if (strncmp(uuid, entry, len))
			continue;
		if (found >= 0)
			return -1; /* a prefix of two devices' UUIDs names neither */
		found = p;
	}
	return found;
}

static void read_visible_devices(void)
{
	const char *env = getenv("CUDA_VISIBLE_DEVICES");
	char *list, *entry, *next;

	if (!env) {
		for (int p = 0; p < cfg.devices; p++)
			cfg.visible[cfg.visible_count++] = p;
		return;
	}
	if (!(list = strdup(env)))
		return;
	for (entry = list; entry && cfg.visible_count < MAX_DEVICES; entry = next) {
		int p;
		bool again = false;

		if ((next = strchr(entry, ',')))
			*next++ = '\0';
		entry += strspn(entry, " \t");
		entry[strcspn(entry, " \t")] = '\0';
		if ((p = device_named(entry)) < 0)
			break;
		for (int i = 0; i < cfg.visible_count; i++)
			again |= cfg.visible[i] == p;
		if (again)
			break;
		cfg.visible[cfg.visible_count++] = p;
	}
	free(list);
}

static void read_failures(void)
{
	const char *env = getenv("KVA_CUDASTUB_FAIL");
	char *list, *entry, *next;

	if (!env || !*env || !(list = strdup(env)))
		return;
	for (entry = list; entry; entry = next) {
		char *colon, *end = NULL;
		unsigned long nth = 0;
		bool bad_nth = false;
		int kind;

		if ((next = strchr(entry, ',')))
			*next++ = '\0';
		if (!*entry)
			continue;
		if (!strcmp(entry, "vmm:unsupported")) {
			cfg.vmm_unsupported = true;
			continue;
		}
		if (!strcmp(entry, "export:unsupported")) {
			cfg.export_unsupported = true;
			continue;
		}
		if ((colon = strchr(entry, ':'))) {
			*colon = '\0';
			nth = strtoul(colon + 1, &end, 10);
			bad_nth = !nth || *end;
		}
		for (kind = 0; kind < FAIL_KINDS; kind++)
			if (fails[kind].name && !strcmp(fails[kind].name, entry))
				break;
		if (kind == FAIL_KINDS || bad_nth) {
			say("KVA_CUDASTUB_FAIL: unknown failure '%s%s%s' ignored", entry,
			    colon ? ":" : "", colon ? colon + 1 : "");
		} else if (!nth) {
			fails[kind].every = true;
		} else if (fails[kind].nths < FAIL_NTH_MAX) {
			fails[kind].nth[fails[kind].nths++] = (unsigned)nth;
		}
	}
	free(list);
}

static void fork_prepare(void);
static void fork_after(void);
static void init_contexts(void);

static void read_config(void)
{
	long page = sysconf(_SC_PAGESIZE);
	const char *s = getenv("KVA_CUDASTUB_DEVICES");

	cfg.devices = 1;
	if (s && *s) {
		char *end;
		long n = strtol(s, &end, 10);

		if (*end || n < 1 || n > MAX_DEVICES)
			say("KVA_CUDASTUB_DEVICES=%s is not 1..%d; using 1", s, MAX_DEVICES);
		else
			cfg.devices = (int)n;
	}
	cfg.memory = env_size("KVA_CUDASTUB_MEMORY", (size_t)8 << 30, false, 1);
	cfg.granularity = env_size("KVA_CUDASTUB_GRANULARITY", (size_t)2 << 20, true,
				   page > 4096 ? (size_t)page : 4096);
	cfg.rdma = env_flag("KVA_CUDASTUB_RDMA", true);
	cfg.no_cpu = env_flag("KVA_CUDASTUB_NO_CPU", false);
	cfg.log = env_flag("KVA_CUDASTUB_LOG", false);
	read_visible_devices();
	read_failures();
	init_contexts();
	/* a child forked while another thread held a lock gets it unlocked */
	pthread_atfork(fork_prepare, fork_after, fork_after);
	arm_exit_check();
	atomic_store_explicit(&config_read, true, memory_order_release);
}

static bool logging(void)
{
	return atomic_load_explicit(&config_read, memory_order_acquire) && cfg.log;
}

static cu_result trace(const char *fn, cu_result r, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* KVA_CUDASTUB_LOG: the call @fn, its arguments and its result @r */
static cu_result trace(const char *fn, cu_result r, const char *fmt, ...)
{
	char args[384];
	va_list ap;

	if (!logging())
		return r;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	say("%s(%s) -> %s", fn, args, result_name(r));
	return r;
}

/* -------------------------------------------------------------- state */

/* A device's primary context. cu_context points at one of primary[]. */
struct cu_ctx_st {
	int ordinal;                   /* the program's */
	int physical;
	unsigned retains;
	unsigned long long id;         /* new each time it comes back from 0 retains */
};

/* VMM memory: one cuMemCreate or import, and the handle to it */
struct alloc {
	bool in_use;                   /* a handle or a mapping holds the memory */
	bool handle_live;              /* not yet given to cuMemRelease */
	bool exportable;               /* asked for POSIX_FD, or imported */
	bool counted;                  /* created here: less free memory */
	int physical;
	int fd;                        /* the memfd; the stand-in's own */
	uint32_t serial;               /* in the handle: a released one stays dead */
	unsigned mappings;
	size_t size;
};

/* cuMemAddressReserve: an anonymous PROT_NONE range */
struct reservation {
	bool in_use;
	cu_deviceptr va;
	size_t size;
};

/*
 * cuMemMap: the memory MAP_SHARED|MAP_FIXED over part of a reservation,
 * and a read-write alias elsewhere for the stand-in's copies. access has
 * one entry per granule: 2 bits (CU_MEM_ACCESS_FLAGS_*) per physical
 * device, as cuMemSetAccess left them.
 */
struct mapping {
	bool in_use;
	cu_deviceptr va;
	size_t size;
	struct reservation *reservation;
	struct alloc *alloc;
	char *alias;
	uint16_t *access;
};

/* a linear range with a memfd of its own: cuMemAlloc, or an IPC open */
struct linear {
	bool in_use;
	bool opened;                   /* by cuIpcOpenMemHandle */
	int physical;
	int fd;
	unsigned opens;                /* IPC: opens not yet closed */
	struct cu_ctx_st *ctx;         /* it dies with the context */
	cu_deviceptr va;
	size_t size;
	char *alias;
	ino_t ino;                     /* an IPC open's key, with dev */
	dev_t dev;
};

struct host_reg {
	bool in_use;
	char *base;
	size_t size;
};

/* cu_stream points at one of streams[] */
struct cu_stream_st {
	bool in_use;
	bool nonblocking;              /* CU_STREAM_NON_BLOCKING: not ordered with the legacy stream */
	struct cu_ctx_st *ctx;
	unsigned long long ctx_id;     /* it dies with that context */
};

/*
 * Everything below is under tables_lock. Each table is used up to its
 * high-water mark (*_used); an entry is free when !in_use. primary[] is
 * written at read_config before initialized is set, retains and id after
 * under the lock.
 */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cu_ctx_st primary[MAX_DEVICES];
static unsigned long long ctx_ids;
static size_t created[MAX_DEVICES];    /* bytes, by physical device */
static uint32_t serials;
static struct alloc allocs[MAX_ALLOCS];
static struct reservation reservations[MAX_RESERVATIONS];
static struct mapping mappings[MAX_MAPPINGS];
static struct linear linears[MAX_LINEARS];
static struct host_reg host_regs[MAX_HOST_REGS];
static struct cu_stream_st streams[MAX_STREAMS];
static size_t allocs_used, reservations_used, mappings_used, linears_used, host_regs_used,
	      streams_used;

/* the calling thread's context stack: its own, so no lock */
static _Thread_local struct cu_ctx_st *ctx_stack[CTX_STACK_DEPTH];
static _Thread_local int ctx_depth;

static void init_contexts(void)
{
	for (int i = 0; i < cfg.visible_count; i++) {
		primary[i].ordinal = i;
		primary[i].physical = cfg.visible[i];
	}
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&tables_lock);
	pthread_mutex_lock(&report_lock);
}

static void fork_after(void)
{
	pthread_mutex_unlock(&report_lock);
	pthread_mutex_unlock(&tables_lock);
}

/* a free entry of a table whose entries begin with bool in_use, cleared;
 * NULL when the table is full */
static void *slot_new(void *table, size_t entry_size, size_t max, size_t *used)
{
	char *entry = NULL;

	for (size_t i = 0; i < *used && !entry; i++)
		if (!*(bool *)((char *)table + i * entry_size))
			entry = (char *)table + i * entry_size;
	if (!entry && *used < max)
		entry = (char *)table + (*used)++ * entry_size;
	if (entry)
		memset(entry, 0, entry_size);
	return entry;
}

#define SLOT_NEW(table) slot_new(table, sizeof(table[0]), sizeof(table) / sizeof(table[0]), \
				 &table##_used)

/* [p, p + n) lies in [base, base + len), without overflow */
static bool inside(cu_deviceptr p, size_t n, cu_deviceptr base, size_t len)
{
	return p >= base && p - base <= len && n <= len - (p - base);
}

static bool overlap(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
	return a < b + blen && b < a + alen;
}

/* ---------------------------------------------------- the usual checks */

static cu_result need_init(const char *fn)
{
	if (atomic_load_explicit(&initialized, memory_order_acquire))
		return CU_SUCCESS;
	return contract(fn, CU_ERROR_NOT_INITIALIZED, "called before a successful cuInit");
}

static bool ctx_retained(const struct cu_ctx_st *ctx)
{
	return ctx && ctx->retains;
}

/* the primary context @ctx points at, or NULL */
static struct cu_ctx_st *ctx_lookup(cu_context ctx)
{
	uintptr_t off = (uintptr_t)ctx - (uintptr_t)primary;

	if (off % sizeof(primary[0]) || off / sizeof(primary[0]) >= (size_t)cfg.visible_count)
		return NULL;
	return &primary[off / sizeof(primary[0])];
}

/* init, and the calling thread's current context, which must be usable:
 * retained. Under tables_lock. */
static cu_result need_ctx(const char *fn, struct cu_ctx_st **ctx)
{
	cu_result r = need_init(fn);

	if (r)
		return r;
	*ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	if (!*ctx)
		return contract(fn, CU_ERROR_INVALID_CONTEXT, "no context is current in this thread");
	if (!ctx_retained(*ctx))
		return contract(fn, CU_ERROR_INVALID_CONTEXT, "the current context (device %d's "
				"primary) was released: it no longer exists", (*ctx)->ordinal);
	return CU_SUCCESS;
}

/* init, and a device the program may name */
static cu_result need_device(const char *fn, cu_device dev)
{
	cu_result r = need_init(fn);

	if (!r && (dev < 0 || dev >= cfg.visible_count))
		r = contract(fn, CU_ERROR_INVALID_DEVICE, "device %d is not one of the %d visible",
			     dev, cfg.visible_count);
	return r;
}

/* init, and the VMM calls not turned off by vmm:unsupported */
static cu_result need_vmm(const char *fn)
{
	cu_result r = need_init(fn);

	if (!r && cfg.vmm_unsupported)
		r = unsupported(fn, "vmm:unsupported");
	return r;
}

static struct cu_stream_st *stream_lookup(cu_stream s)
{
	uintptr_t off = (uintptr_t)s - (uintptr_t)streams;

	if (off % sizeof(streams[0]) || off / sizeof(streams[0]) >= streams_used ||
	    !streams[off / sizeof(streams[0])].in_use)
		return NULL;
	return &streams[off / sizeof(streams[0])];
}

/* a stream an async call may take: NULL or a special one, or a live
 * stream of the current context @ctx */
static cu_result need_stream(const char *fn, cu_stream s, const struct cu_ctx_st *ctx)
{
	struct cu_stream_st *stream;

	if (!s || s == STREAM_LEGACY || s == STREAM_PER_THREAD)
		return CU_SUCCESS;
	if (!(stream = stream_lookup(s)))
		return contract(fn, CU_ERROR_INVALID_HANDLE, "stream %p is not a live stream",
				(void *)s);
	if (stream->ctx != ctx || stream->ctx_id != ctx->id)
		return contract(fn, CU_ERROR_INVALID_HANDLE, "stream %p belongs to another "
				"context than the current one", (void *)s);
	return CU_SUCCESS;
}

/* ------------------------------------------------------- device memory */

#define HANDLE_TAG 0x6b76ULL /* "kv": the top 16 bits of every handle */

static cu_mem_handle handle_of(const struct alloc *a)
{
	return HANDLE_TAG << 48 | (cu_mem_handle)a->serial << 16 | (cu_mem_handle)(a - allocs);
}

/* the allocation a live handle names, or NULL */
static struct alloc *handle_lookup(cu_mem_handle h)
{
	size_t i = h & 0xffff;

	if (h >> 48 != HANDLE_TAG || i >= allocs_used || !allocs[i].in_use ||
	    !allocs[i].handle_live || allocs[i].serial != (uint32_t)(h >> 16))
		return NULL;
	return &allocs[i];
}

/*
 * The memory goes when nothing holds it: neither handle nor mapping. The
 * memfd goes with the handle: the mappings hold the memory themselves, and
 * the real driver keeps no descriptor per allocation in the process (a
 * worker that maps thousands of chunks must not run out of them here when
 * it would not on a GPU).
 */
static void alloc_put(struct alloc *a)
{
	if (!a->handle_live && a->fd >= 0) {
		close(a->fd);
		a->fd = -1;
	}
	if (a->handle_live || a->mappings)
		return;
	if (a->counted)
		created[a->physical] -= a->size;
	a->in_use = false;
}

static struct alloc *alloc_new(int physical, int fd, size_t size, bool exportable, bool counted)
{
	struct alloc *a = SLOT_NEW(allocs);

	if (!a)
		return NULL;
	a->in_use = a->handle_live = true;
	a->exportable = exportable;
	a->counted = counted;
	a->physical = physical;
	a->fd = fd;
	a->size = size;
	a->serial = ++serials;
	if (counted)
		created[physical] += size;
	return a;
}

/* the device memory of the stand-in, named so that an import can tell it */
static int device_memfd(int physical, size_t size)
{
	char name[32];
	int fd;

	snprintf(name, sizeof(name), "cudastub-dev%d", physical);
	if ((fd = memfd_create(name, MFD_CLOEXEC)) < 0)
		return -1;
	if (ftruncate(fd, (off_t)size) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* the physical device of a stand-in memfd @fd, or -1 if it is none */
static int device_of_memfd(int fd)
{
	static const char prefix[] = "/memfd:cudastub-dev";
	char path[64], target[256];
	ssize_t len;
	char *end;
	long physical;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (fd < 0 || (len = readlink(path, target, sizeof(target) - 1)) < 0)
		return -1;
	target[len] = '\0';
	if (strncmp(target, prefix, sizeof(prefix) - 1))
		return -1;
	physical = strtol(target + sizeof(prefix) - 1, &end, 10);
	if (end == target + sizeof(prefix) - 1 || (*end && *end != ' ') || physical < 0 ||
	    physical >= MAX_DEVICES)
		return -1;
	return (int)physical;
}

static struct reservation *reservation_of(cu_deviceptr p, size_t n)
{
	for (size_t i = 0; i < reservations_used; i++)
		if (reservations[i].in_use &&
		    inside(p, n, reservations[i].va, reservations[i].size))
			return &reservations[i];
	return NULL;
}

static struct mapping *mapping_of(cu_deviceptr p)
{
	for (size_t i = 0; i < mappings_used; i++)
		if (mappings[i].in_use && inside(p, 1, mappings[i].va, mappings[i].size))
			return &mappings[i];
	return NULL;
}

static struct mapping *mapping_overlapping(cu_deviceptr p, size_t n)
{
	for (size_t i = 0; i < mappings_used; i++)
		if (mappings[i].in_use && overlap(p, n, mappings[i].va, mappings[i].size))
			return &mappings[i];
	return NULL;
}

static struct linear *linear_of(cu_deviceptr p)
{
	for (size_t i = 0; i < linears_used; i++)
		if (linears[i].in_use && inside(p, 1, linears[i].va, linears[i].size))
			return &linears[i];
	return NULL;
}

/* the access some device has to a granule: CU_MEM_ACCESS_FLAGS_* */
static int access_any(uint16_t access)
{
	int any = 0;

	for (int d = 0; d < MAX_DEVICES; d++)
		any |= (access >> (2 * d)) & 3;
	return any;
}

/* what the CPU may do to a granule some device may read or write */
static int cpu_prot(uint16_t access)
{
	int any = access_any(access);

	if (cfg.no_cpu)
		return PROT_NONE;
	return any & 2 ? PROT_READ | PROT_WRITE : any & 1 ? PROT_READ : PROT_NONE;
}

/*
 * device_bytes - where the stand-in itself reads or writes device address
 * @p: the byte in its alias of the memory, and in @run how many bytes from
 * there the same mapping or linear range holds with @need access
 * (CU_MEM_ACCESS_FLAGS_PROT_READ or _READWRITE, for some device). @owner
 * is the reservation or linear range, so a copy can stay inside one. NULL,
 * with the reason in @why, when @p is in no memory a copy may touch.
 */
static char *device_bytes(cu_deviceptr p, int need, size_t *run, const void **owner,
			  const char **why)
{
	struct linear *l = linear_of(p);
	struct mapping *m;
	size_t off, granule, granules;

	if (l) {
		*run = l->size - (p - l->va);
		*owner = l;
		return l->alias + (p - l->va);
	}
	if (!(m = mapping_of(p))) {
		*why = "is in no mapping, cuMemAlloc allocation or IPC open";
		return NULL;
	}
	off = p - m->va;
	granule = off / cfg.granularity;
	granules = m->size / cfg.granularity;
	if ((access_any(m->access[granule]) & need) != need) {
		*why = need == CU_MEM_ACCESS_FLAGS_PROT_READ ? "is mapped with no read access "
			"set (cuMemSetAccess)" : "is mapped with no read-write access set "
			"(cuMemSetAccess)";
		return NULL;
	}
	while (granule + 1 < granules && (access_any(m->access[granule + 1]) & need) == need)
		granule++;
	*run = (granule + 1) * cfg.granularity - off;
	*owner = m->reservation;
	return m->alias + off;
}

/* every byte of [p, p + n) is in memory a copy may touch with @need: one
 * cuMemAlloc allocation or IPC open, or a run of mappings inside one
 * reservation */
static cu_result need_device_range(const char *fn, cu_deviceptr p, size_t n, int need)
{
	const void *first = NULL, *owner = NULL;
	const char *why = "";
	size_t run;

	if (n > UINT64_MAX - p)
		return contract(fn, CU_ERROR_INVALID_VALUE, "device range 0x%llx+%zu wraps", p, n);
	for (size_t done = 0; done < n; done += run) {
		if (!device_bytes(p + done, need, &run, &owner, &why))
			return contract(fn, CU_ERROR_INVALID_VALUE, "device range 0x%llx+%zu: byte "
					"0x%llx %s", p, n, p + done, why);
		if (done && owner != first)
			return contract(fn, CU_ERROR_INVALID_VALUE, "device range 0x%llx+%zu runs "
					"from one allocation or reservation into another at 0x%llx",
					p, n, p + done);
		first = owner;
	}
	return CU_SUCCESS;
}

/* ---------------------------------------------- init, devices, errors */

static cu_result cuInit(unsigned int flags)
{
	cu_result r;

	pthread_once(&config_once, read_config);
	if (flags)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags %u: must be 0", flags);
	else if (!(r = inject(FAIL_INIT, __func__)) && !cfg.visible_count)
		r = CU_ERROR_NO_DEVICE;
	if (!r)
		atomic_store_explicit(&initialized, true, memory_order_release);
	return trace(__func__, r, "flags=%u", flags);
}

/* like the real driver's, answered before cuInit */
static cu_result cuDriverGetVersion(int *version)
{
	cu_result r = CU_SUCCESS;

	if (!version)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "version is NULL");
	else
		*version = DRIVER_VERSION;
	return trace(__func__, r, "%d", r ? 0 : DRIVER_VERSION);
}

static cu_result cuDeviceGetCount(int *count)
{
	cu_result r = need_init(__func__);

	if (!r && !count)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "count is NULL");
	else if (!r)
		*count = cfg.visible_count;
	return trace(__func__, r, "%d", r ? -1 : *count);
}

static cu_result cuDeviceGet(cu_device *dev, int ordinal)
{
	cu_result r = need_init(__func__);

	if (!r && !dev)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "dev is NULL");
	else if (!r && (ordinal < 0 || ordinal >= cfg.visible_count))
		r = CU_ERROR_INVALID_DEVICE; /* asking is no breach: it is how to probe */
	else if (!r)
		*dev = ordinal;
	return trace(__func__, r, "ordinal=%d", ordinal);
}

static cu_result cuDeviceGetName(char *name, int len, cu_device dev)
{
	cu_result r = need_device(__func__, dev);

	if (!r && (!name || len <= 0))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "no room for the name (%p, %d)",
			     (void *)name, len);
	else if (!r)
		snprintf(name, (size_t)len, "kvarena CUDA driver stand-in (device %d)",
			 cfg.visible[dev]);
	return trace(__func__, r, "dev=%d", dev);
}

static cu_result cuDeviceGetUuid(cu_uuid *uuid, cu_device dev)
{
	cu_result r = need_device(__func__, dev);

	if (!r && !uuid)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "uuid is NULL");
	else if (!r)
		device_uuid(cfg.visible[dev], uuid);
	return trace(__func__, r, "dev=%d", dev);
}

static cu_result cuDeviceTotalMem(size_t *bytes, cu_device dev)
{
	cu_result r = need_device(__func__, dev);

	if (!r && !bytes)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "bytes is NULL");
	else if (!r)
		*bytes = cfg.memory;
	return trace(__func__, r, "dev=%d", dev);
}

static cu_result cuDeviceGetAttribute(int *value, int attr, cu_device dev)
{
	cu_result r = need_device(__func__, dev);

	if (!r && !value)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "value is NULL");
	if (r)
		goto out;
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*value = !cfg.vmm_unsupported;
		break;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*value = !cfg.vmm_unsupported && !cfg.export_unsupported;
		break;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
		*value = !cfg.vmm_unsupported && cfg.rdma;
		break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
		*value = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
		*value = 101376;
		break;
	default:
		/* the stand-in's limit, not the caller's fault: no breach */
		r = CU_ERROR_INVALID_VALUE;
	}
out:
	return trace(__func__, r, "attr=%d dev=%d -> %d", attr, dev, r ? 0 : *value);
}

static cu_result cuDeviceGetPCIBusId(char *bus_id, int len, cu_device dev)
{
	cu_result r = need_device(__func__, dev);

	if (!r && (!bus_id || len <= 0))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "no room for the bus id (%p, %d)",
			     (void *)bus_id, len);
	else if (!r)
		snprintf(bus_id, (size_t)len, "0000:%02x:00.0", cfg.visible[dev]);
	return trace(__func__, r, "dev=%d", dev);
}

/* both answered before cuInit, as the real driver's are */
static cu_result error_text(const char *fn, cu_result error, const char **str, bool name)
{
	cu_result r = CU_ERROR_INVALID_VALUE;

	if (!str)
		return contract(fn, CU_ERROR_INVALID_VALUE, "str is NULL");
	*str = NULL;
	for (size_t i = 0; i < sizeof(results) / sizeof(results[0]); i++) {
		if (results[i].value == error) {
			*str = name ? results[i].name : results[i].text;
			r = CU_SUCCESS;
		}
	}
	return trace(fn, r, "error=%d", error);
}

static cu_result cuGetErrorString(cu_result error, const char **str)
{
	return error_text(__func__, error, str, false);
}

static cu_result cuGetErrorName(cu_result error, const char **str)
{
	return error_text(__func__, error, str, true);
}

/* ------------------------------------------------------------ contexts */

static cu_result cuDevicePrimaryCtxRetain(cu_context *ctx, cu_device dev)
{
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_device(__func__, dev)))
		goto out;
	if (!ctx) {
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "ctx is NULL");
		goto out;
	}
	if (!primary[dev].retains++)
		primary[dev].id = ++ctx_ids;
	*ctx = &primary[dev];
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "dev=%d", dev);
}

static void linear_free(struct linear *l);
static void work_flush_all(void);
static void work_flush(const struct cu_ctx_st *ctx, const struct cu_stream_st *stream,
		       bool legacy, bool all);

/*
 * The last release destroys the context, and with it what was made in it
 * (the real driver frees its streams and cuMemAlloc memory; VMM memory
 * belongs to no context).
 */
static cu_result cuDevicePrimaryCtxRelease(cu_device dev)
{
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_device(__func__, dev)))
		goto out;
	if (!primary[dev].retains) {
		r = contract(__func__, CU_ERROR_INVALID_CONTEXT, "device %d's primary context is "
			     "released more often than it was retained", dev);
		goto out;
	}
	if (--primary[dev].retains)
		goto out;
	work_flush_all(); /* a context ends when its work is done */
	for (size_t i = 0; i < streams_used; i++)
		if (streams[i].in_use && streams[i].ctx == &primary[dev])
			streams[i].in_use = false;
	for (size_t i = 0; i < linears_used; i++)
		if (linears[i].in_use && linears[i].ctx == &primary[dev])
			linear_free(&linears[i]);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "dev=%d", dev);
}

static cu_result cuCtxGetCurrent(cu_context *ctx)
{
	cu_result r = need_init(__func__);

	if (!r && !ctx)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "ctx is NULL");
	else if (!r)
		*ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	return trace(__func__, r, "%p", r ? NULL : (void *)*ctx);
}

/* init, and a context that exists: retained */
static cu_result need_live_ctx(const char *fn, cu_context ctx)
{
	cu_result r = need_init(fn);

	if (!r && !ctx_lookup(ctx))
		r = contract(fn, CU_ERROR_INVALID_CONTEXT, "%p is not a context", (void *)ctx);
	else if (!r && !ctx_retained(ctx))
		r = contract(fn, CU_ERROR_INVALID_CONTEXT, "device %d's primary context was "
			     "released: it no longer exists", ctx->ordinal);
	return r;
}

/* NULL pops, as the docs say; else it replaces the top of the stack */
static cu_result cuCtxSetCurrent(cu_context ctx)
{
	cu_result r = CU_SUCCESS;

	pthread_mutex_lock(&tables_lock);
	if (!ctx) {
		if (!(r = need_init(__func__)) && ctx_depth)
			ctx_depth--;
	} else if (!(r = need_live_ctx(__func__, ctx))) {
		if (!ctx_depth)
			ctx_depth++;
		ctx_stack[ctx_depth - 1] = ctx;
	}
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ctx=%p", (void *)ctx);
}

static cu_result cuCtxPushCurrent(cu_context ctx)
{
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_live_ctx(__func__, ctx))) {
		if (ctx_depth == CTX_STACK_DEPTH)
			r = CU_ERROR_OUT_OF_MEMORY; /* the stand-in's limit */
		else
			ctx_stack[ctx_depth++] = ctx;
	}
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ctx=%p", (void *)ctx);
}

static cu_result cuCtxPopCurrent(cu_context *ctx)
{
	cu_result r = need_init(__func__);

	if (!r && !ctx_depth)
		r = contract(__func__, CU_ERROR_INVALID_CONTEXT, "no context is current in this "
			     "thread: nothing to pop");
	if (!r) {
		ctx_depth--;
		if (ctx)
			*ctx = ctx_stack[ctx_depth];
	}
	return trace(__func__, r, "-> %p", r ? NULL : (void *)ctx_stack[ctx_depth]);
}

static cu_result cuCtxGetDevice(cu_device *dev)
{
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_ctx(__func__, &ctx)) && !dev)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "dev is NULL");
	else if (!r)
		*dev = ctx->ordinal;
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "-> %d", r ? -1 : *dev);
}

static cu_result cuCtxSynchronize(void)
{
	struct cu_ctx_st *ctx;
	cu_result r;

	/* everything the context queued, on every stream */
	pthread_mutex_lock(&tables_lock);
	if (!(r = need_ctx(__func__, &ctx)))
		work_flush(ctx, NULL, false, false);
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "%s", "");
}

static cu_result cuCtxGetId(cu_context ctx, unsigned long long *id)
{
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_live_ctx(__func__, ctx)) && !id)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "id is NULL");
	else if (!r)
		*id = ctx->id;
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ctx=%p", (void *)ctx);
}

static cu_result cuMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!free_bytes || !total_bytes)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "free or total is NULL");
	else if (!(r = inject(FAIL_GETINFO, __func__))) {
		*total_bytes = cfg.memory;
		*free_bytes = cfg.memory - created[ctx->physical];
	}
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "free=%zu", r ? 0 : *free_bytes);
}

/* ------------------------------------------------------------------ VMM */

/* an allocation's properties, as cuMemCreate and
 * cuMemGetAllocationGranularity take them; the device's physical id in
 * *physical */
static cu_result need_prop(const char *fn, const cu_mem_allocation_prop *prop, int *physical)
{
	if (!prop)
		return contract(fn, CU_ERROR_INVALID_VALUE, "prop is NULL");
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return contract(fn, CU_ERROR_INVALID_VALUE, "prop.type %d is not "
				"CU_MEM_ALLOCATION_TYPE_PINNED", prop->type);
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return contract(fn, CU_ERROR_INVALID_VALUE, "prop.location.type %d is not "
				"CU_MEM_LOCATION_TYPE_DEVICE", prop->location.type);
	if (prop->location.id < 0 || prop->location.id >= cfg.visible_count)
		return contract(fn, CU_ERROR_INVALID_DEVICE, "prop.location.id %d is not one of "
				"the %d visible devices", prop->location.id, cfg.visible_count);
	if (prop->win32_handle_meta_data)
		return contract(fn, CU_ERROR_INVALID_VALUE, "prop.win32HandleMetaData is not NULL");
	if (prop->requested_handle_types != CU_MEM_HANDLE_TYPE_NONE &&
	    prop->requested_handle_types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return contract(fn, CU_ERROR_INVALID_VALUE, "prop.requestedHandleTypes 0x%x is "
				"neither NONE nor POSIX_FILE_DESCRIPTOR",
				prop->requested_handle_types);
	if (prop->alloc_flags.gpu_direct_rdma_capable && !cfg.rdma)
		return contract(fn, CU_ERROR_NOT_SUPPORTED, "gpuDirectRDMACapable asked of a device "
				"without GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED");
	*physical = cfg.visible[prop->location.id];
	return CU_SUCCESS;
}

static cu_result cuMemGetAllocationGranularity(size_t *granularity,
					       const cu_mem_allocation_prop *prop, int option)
{
	cu_result r;
	int physical;

	if ((r = need_vmm(__func__)) || (r = need_prop(__func__, prop, &physical)))
		goto out;
	if (!granularity)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "granularity is NULL");
	else if (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM)
		*granularity = cfg.granularity;
	else if (option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		*granularity = 2 * cfg.granularity;
	else
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "option %d is neither MINIMUM nor "
			     "RECOMMENDED", option);
out:
	return trace(__func__, r, "option=%d -> %zu", option, r ? 0 : *granularity);
}

static cu_result cuMemCreate(cu_mem_handle *handle, size_t size,
			     const cu_mem_allocation_prop *prop, unsigned long long flags)
{
	struct alloc *a;
	cu_result r;
	int physical = 0, fd;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)) || (r = need_prop(__func__, prop, &physical)))
		goto out;
	if (!handle)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "handle is NULL");
	else if (flags)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%llx: must be 0", flags);
	else if (!size || size % cfg.granularity)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "size %zu is not a multiple of the "
			     "minimum granularity %zu", size, cfg.granularity);
	else if (cfg.export_unsupported &&
		 prop->requested_handle_types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		r = unsupported(__func__, "export:unsupported");
	if (r || (r = inject(FAIL_CREATE, __func__)))
		goto out;
	if (size > cfg.memory - created[physical]) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if ((fd = device_memfd(physical, size)) < 0) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (!(a = alloc_new(physical, fd, size, prop->requested_handle_types ==
			    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, true))) {
		close(fd);
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*handle = handle_of(a);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "size=%zu flags=0x%llx -> 0x%llx", size, flags,
		     r ? 0 : *handle);
}

/* releasing a mapped handle is legal: the memory lives until its last
 * mapping goes */
static cu_result cuMemRelease(cu_mem_handle handle)
{
	struct alloc *a;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!(a = handle_lookup(handle))) {
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not a live handle (never "
			     "made, or released already)", handle);
		goto out;
	}
	a->handle_live = false;
	alloc_put(a);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "handle=0x%llx", handle);
}

static cu_result cuMemExportToShareableHandle(void *shareable, cu_mem_handle handle, int type,
					      unsigned long long flags)
{
	struct alloc *a = NULL;
	cu_result r;
	int fd = -1;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!shareable)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "shareableHandle is NULL");
	else if (flags)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%llx: must be 0", flags);
	else if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "handle type 0x%x is not "
			     "POSIX_FILE_DESCRIPTOR", type);
	else if (!(a = handle_lookup(handle)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not a live handle",
			     handle);
	else if (!a->exportable)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx was created without asking "
			     "for POSIX_FILE_DESCRIPTOR in requestedHandleTypes", handle);
	else if (cfg.export_unsupported)
		r = unsupported(__func__, "export:unsupported");
	if (r || (r = inject(FAIL_EXPORT, __func__)))
		goto out;
	if ((fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		r = CU_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	*(int *)shareable = fd;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "handle=0x%llx type=%d -> fd %d", handle, type, fd);
}

/* the fd stays the caller's; the handle holds a dup of its own */
static cu_result cuMemImportFromShareableHandle(cu_mem_handle *handle, void *os_handle,
						int type)
{
	int fd = (int)(intptr_t)os_handle, physical, own = -1;
	struct alloc *a;
	struct stat st;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!handle)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "handle is NULL");
	else if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "handle type 0x%x is not "
			     "POSIX_FILE_DESCRIPTOR", type);
	else if ((physical = device_of_memfd(fd)) < 0)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "fd %d is not device memory "
			     "exported by cuMemExportToShareableHandle", fd);
	if (r || (r = inject(FAIL_IMPORT, __func__)))
		goto out;
	if ((own = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0 || fstat(own, &st) < 0) {
		r = CU_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	if (!(a = alloc_new(physical, own, (size_t)st.st_size, true, false))) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	own = -1;
	*handle = handle_of(a);
out:
	if (own >= 0)
		close(own);
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "fd=%d -> 0x%llx", fd, r ? 0 : *handle);
}

/* an anonymous PROT_NONE range of @size at a multiple of @align, at @hint
 * if that is free; MAP_FAILED if there is no room */
static void *reserve_range(size_t size, size_t align, uintptr_t hint)
{
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	char *base, *aligned;

	if (hint && !(hint % align)) {
		base = mmap((void *)hint, size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
		if (base == (void *)hint)
			return base;
		if (base != MAP_FAILED)
			munmap(base, size); /* a kernel that took it for a hint */
	}
	if (size > SIZE_MAX - align)
		return MAP_FAILED;
	base = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
	if (base == MAP_FAILED)
		return MAP_FAILED;
	aligned = base + (align - (uintptr_t)base % align) % align;
	if (aligned > base)
		munmap(base, aligned - base);
	munmap(aligned + size, base + align - aligned);
	return aligned;
}

static cu_result cuMemAddressReserve(cu_deviceptr *ptr, size_t size, size_t alignment,
				     cu_deviceptr addr, unsigned long long flags)
{
	struct reservation *res;
	size_t page = (size_t)sysconf(_SC_PAGESIZE), align;
	cu_result r;
	void *va;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!ptr)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "ptr is NULL");
	else if (!size || size % cfg.granularity)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "size %zu is not a multiple of the "
			     "minimum granularity %zu", size, cfg.granularity);
	else if (alignment & (alignment - 1))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "alignment %zu is not a power of two",
			     alignment);
	else if (flags)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%llx: must be 0", flags);
	if (r || (r = inject(FAIL_RESERVE, __func__)))
		goto out;
	align = alignment ? alignment : cfg.granularity;
	if (align < page)
		align = page;
	if (!(res = SLOT_NEW(reservations)) ||
	    (va = reserve_range(size, align, (uintptr_t)addr)) == MAP_FAILED) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	res->in_use = true;
	res->va = (uintptr_t)va;
	res->size = size;
	*ptr = res->va;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "size=%zu alignment=%zu addr=0x%llx -> 0x%llx", size, alignment,
		     addr, r ? 0 : *ptr);
}

static cu_result cuMemAddressFree(cu_deviceptr ptr, size_t size)
{
	struct reservation *res;
	struct mapping *m;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!(res = reservation_of(ptr, 1)) || res->va != ptr || res->size != size)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not a reservation "
			     "(give the address and size cuMemAddressReserve gave)", ptr, size);
	else if ((m = mapping_overlapping(ptr, size)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is still mapped in it: "
			     "unmap before freeing the address range", m->va, m->size);
	if (r)
		goto out;
	munmap((void *)(uintptr_t)res->va, res->size);
	res->in_use = false;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx size=%zu", ptr, size);
}

/* map @a's first @size bytes at @va of @res: PROT_NONE until access is set */
static cu_result map_alloc(struct reservation *res, cu_deviceptr va, size_t size,
			   struct alloc *a)
{
	struct mapping *m = SLOT_NEW(mappings);
	void *alias = MAP_FAILED;
	cu_result r = CU_ERROR_OUT_OF_MEMORY;

	if (!m || !(m->access = calloc(size / cfg.granularity, sizeof(m->access[0]))))
		goto fail;
	alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (alias == MAP_FAILED ||
	    mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) ==
	    MAP_FAILED)
		goto fail;
	m->in_use = true;
	m->va = va;
	m->size = size;
	m->reservation = res;
	m->alloc = a;
	m->alias = alias;
	a->mappings++;
	return CU_SUCCESS;
fail:
	if (alias != MAP_FAILED)
		munmap(alias, size);
	if (m)
		free(m->access);
	return r;
}

static cu_result cuMemMap(cu_deviceptr ptr, size_t size, size_t offset, cu_mem_handle handle,
			  unsigned long long flags)
{
	struct reservation *res = NULL;
	struct alloc *a = NULL;
	struct mapping *m;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (flags)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%llx: must be 0", flags);
	else if (offset)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "offset %zu: the docs say it "
			     "currently must be zero", offset);
	else if (!size || ptr % cfg.granularity || size % cfg.granularity)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not in whole granules "
			     "of the minimum granularity %zu", ptr, size, cfg.granularity);
	else if (!(a = handle_lookup(handle)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not a live handle",
			     handle);
	else if (size > a->size)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "size %zu is larger than the "
			     "allocation (%zu)", size, a->size);
	else if (!(res = reservation_of(ptr, size)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not inside one "
			     "reservation (cuMemAddressReserve)", ptr, size);
	else if ((m = mapping_overlapping(ptr, size)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu overlaps the mapping at "
			     "0x%llx+%zu", ptr, size, m->va, m->size);
	if (r || (r = inject(FAIL_MAP, __func__)))
		goto out;
	r = map_alloc(res, ptr, size, a);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx size=%zu offset=%zu handle=0x%llx flags=0x%llx",
		     ptr, size, offset, handle, flags);
}

/* the range goes back to the reservation: anonymous PROT_NONE again */
static void unmap_one(struct mapping *m)
{
	mmap((void *)(uintptr_t)m->va, m->size, PROT_NONE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	munmap(m->alias, m->size);
	free(m->access);
	m->in_use = false;
	m->alloc->mappings--;
	alloc_put(m->alloc);
}

/* the mapping that begins at @p and ends by @end, or NULL */
static struct mapping *whole_mapping_at(cu_deviceptr p, cu_deviceptr end)
{
	struct mapping *m = mapping_of(p);

	return m && m->va == p && m->size <= end - p ? m : NULL;
}

static cu_result cuMemUnmap(cu_deviceptr ptr, size_t size)
{
	cu_deviceptr p, end = ptr + size;
	struct mapping *m;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	work_flush_all(); /* queued work lands before its memory goes */
	if ((r = need_vmm(__func__)))
		goto out;
	if (!size || end < ptr) {
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is no range", ptr, size);
		goto out;
	}
	/* all of it is whole mappings, or none of it is unmapped */
	for (p = ptr; p < end && (m = whole_mapping_at(p, end)); p += m->size)
		;
	if (p < end) {
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not whole mappings: "
			     "none begins at 0x%llx and ends inside the range", ptr, size, p);
		goto out;
	}
	for (p = ptr; p < end; p += m->size) {
		m = whole_mapping_at(p, end);
		unmap_one(m);
	}
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx size=%zu", ptr, size);
}

/* the granules of [ptr, ptr + size) get @set for the devices in @mask,
 * and the CPU what the devices have together */
static cu_result apply_access(cu_deviceptr ptr, size_t size, uint16_t mask, uint16_t set)
{
	cu_result r = CU_SUCCESS;

	for (size_t i = 0; i < mappings_used; i++) {
		struct mapping *m = &mappings[i];

		if (!m->in_use || !overlap(ptr, size, m->va, m->size))
			continue;
		for (size_t off = 0; off < m->size; off += cfg.granularity) {
			uint16_t *access = &m->access[off / cfg.granularity];

			if (!inside(m->va + off, cfg.granularity, ptr, size))
				continue;
			*access = (uint16_t)((*access & ~mask) | set);
			if (!cfg.no_cpu && mprotect((void *)(uintptr_t)(m->va + off),
						    cfg.granularity, cpu_prot(*access)))
				r = CU_ERROR_OPERATING_SYSTEM;
		}
	}
	return r;
}

static cu_result cuMemSetAccess(cu_deviceptr ptr, size_t size, const cu_mem_access_desc *desc,
				size_t count)
{
	uint16_t mask = 0, set = 0;
	size_t run = 0;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_vmm(__func__)))
		goto out;
	if (!desc || !count)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "no access descriptor (%p, count "
			     "%zu)", (const void *)desc, count);
	else if (!size || ptr % cfg.granularity || size % cfg.granularity)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not in whole granules "
			     "of the minimum granularity %zu", ptr, size, cfg.granularity);
	else if (!reservation_of(ptr, size))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not inside one "
			     "reservation", ptr, size);
	for (size_t done = 0; !r && done < size; done += run) {
		struct mapping *m = mapping_of(ptr + done);

		if (!m)
			r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx+%zu is not all mapped: "
				     "0x%llx is not", ptr, size, ptr + done);
		else
			run = m->size - (ptr + done - m->va);
	}
	for (size_t i = 0; !r && i < count; i++) {
		const cu_mem_access_desc *d = &desc[i];
		int shift;

		if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE || d->location.id < 0 ||
		    d->location.id >= cfg.visible_count) {
			r = contract(__func__, CU_ERROR_INVALID_DEVICE, "desc[%zu].location (type %d, "
				     "id %d) is not a visible device", i, d->location.type,
				     d->location.id);
		} else if (d->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
			   d->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
			   d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
			r = contract(__func__, CU_ERROR_INVALID_VALUE, "desc[%zu].flags 0x%x is not "
				     "PROT_NONE, PROT_READ or PROT_READWRITE", i, d->flags);
		} else {
			shift = 2 * cfg.visible[d->location.id];
			mask |= (uint16_t)(3 << shift);
			set = (uint16_t)((set & ~(3 << shift)) | d->flags << shift);
		}
	}
	if (r || (r = inject(FAIL_ACCESS, __func__)))
		goto out;
	r = apply_access(ptr, size, mask, set);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx size=%zu count=%zu flags[0]=%d", ptr, size, count,
		     desc && count ? desc[0].flags : -1);
}

/* --------------------------------------------------------------- legacy */

static void linear_free(struct linear *l)
{
	munmap((void *)(uintptr_t)l->va, l->size);
	munmap(l->alias, l->size);
	close(l->fd);
	if (!l->opened)
		created[l->physical] -= l->size;
	l->in_use = false;
}

/* map @fd's first @size bytes as a linear range of @ctx: the pointer
 * (CPU-accessible unless KVA_CUDASTUB_NO_CPU) and the stand-in's alias */
static struct linear *linear_new(struct cu_ctx_st *ctx, int physical, int fd, size_t size)
{
	struct linear *l = SLOT_NEW(linears);
	int prot = cfg.no_cpu ? PROT_NONE : PROT_READ | PROT_WRITE;
	void *va = MAP_FAILED, *alias = MAP_FAILED;
	struct stat st;

	if (!l || fstat(fd, &st) < 0)
		goto fail;
	va = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
	alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (va == MAP_FAILED || alias == MAP_FAILED)
		goto fail;
	l->in_use = true;
	l->ctx = ctx;
	l->physical = physical;
	l->fd = fd;
	l->va = (uintptr_t)va;
	l->size = size;
	l->alias = alias;
	l->ino = st.st_ino;
	l->dev = st.st_dev;
	return l;
fail:
	if (va != MAP_FAILED)
		munmap(va, size);
	if (alias != MAP_FAILED)
		munmap(alias, size);
	return NULL;
}

static cu_result cuMemAlloc(cu_deviceptr *ptr, size_t size)
{
	struct cu_ctx_st *ctx;
	struct linear *l;
	cu_result r;
	int fd;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!ptr)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "ptr is NULL");
	else if (!size)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "size is 0");
	if (r || (r = inject(FAIL_ALLOC, __func__)))
		goto out;
	if (size > cfg.memory - created[ctx->physical] ||
	    (fd = device_memfd(ctx->physical, size)) < 0) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (!(l = linear_new(ctx, ctx->physical, fd, size))) {
		close(fd);
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	created[ctx->physical] += size;
	*ptr = l->va;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "size=%zu -> 0x%llx", size, r ? 0 : *ptr);
}

/* the cuMemAlloc allocation (!opened) or IPC open (opened) at @ptr */
static struct linear *linear_at(cu_deviceptr ptr, bool opened)
{
	struct linear *l = linear_of(ptr);

	return l && l->va == ptr && l->opened == opened ? l : NULL;
}

static cu_result cuMemFree(cu_deviceptr ptr)
{
	struct cu_ctx_st *ctx;
	struct linear *l;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	work_flush_all(); /* queued work lands before its memory goes */
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if ((l = linear_at(ptr, false)))
		linear_free(l);
	else if (linear_at(ptr, true))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx was opened by "
			     "cuIpcOpenMemHandle: close it with cuIpcCloseMemHandle", ptr);
	else
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not the base of a live "
			     "cuMemAlloc allocation", ptr);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx", ptr);
}

/*
 * What cuIpcGetMemHandle puts in the 64 bytes: enough for another process
 * to open the exporter's memfd through /proc, and to be sure that what it
 * opened is that memory and not a later one with a recycled fd number.
 */
struct ipc_wire {
	char magic[8];                 /* IPC_MAGIC */
	int32_t pid;                   /* the exporter */
	int32_t fd;                    /* the memfd, in the exporter */
	int32_t physical;
	uint32_t reserved;
	uint64_t size;
	uint64_t ino, dev;             /* the memfd's st_ino, st_dev */
};

_Static_assert(sizeof(struct ipc_wire) <= CU_IPC_HANDLE_SIZE, "an IPC handle is 64 bytes");
static const char IPC_MAGIC[8] = { 'K', 'V', 'A', 'S', 'T', 'U', 'B', '1' };

static cu_result cuIpcGetMemHandle(cu_ipc_mem_handle *handle, cu_deviceptr ptr)
{
	struct ipc_wire wire = { .pid = 0 };
	struct cu_ctx_st *ctx;
	struct linear *l = NULL;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!handle)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "handle is NULL");
	else if (!(l = linear_at(ptr, false)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not the base of a live "
			     "cuMemAlloc allocation", ptr);
	if (r || (r = inject(FAIL_IPC_GET, __func__)))
		goto out;
	memcpy(wire.magic, IPC_MAGIC, sizeof(wire.magic));
	wire.pid = getpid();
	wire.fd = l->fd;
	wire.physical = l->physical;
	wire.size = l->size;
	wire.ino = l->ino;
	wire.dev = l->dev;
	memset(handle, 0, sizeof(*handle));
	memcpy(handle->reserved, &wire, sizeof(wire));
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx", ptr);
}

/* the open of @wire's memory in @ctx, to count another open of */
static struct linear *ipc_open_of(const struct ipc_wire *wire, const struct cu_ctx_st *ctx)
{
	for (size_t i = 0; i < linears_used; i++) {
		struct linear *l = &linears[i];

		if (l->in_use && l->opened && l->ctx == ctx && l->ino == wire->ino &&
		    l->dev == wire->dev)
			return l;
	}
	return NULL;
}

/*
 * Opening a handle a process exported itself is refused, as the docs say.
 * A handle whose exporter has gone or freed the memory is refused with
 * CU_ERROR_INVALID_HANDLE and is no breach: the peer's doing, not the
 * caller's.
 */
static cu_result cuIpcOpenMemHandle(cu_deviceptr *ptr, cu_ipc_mem_handle handle,
				    unsigned int flags)
{
	struct cu_ctx_st *ctx;
	struct ipc_wire wire;
	struct linear *l;
	struct stat st;
	char path[64];
	cu_result r;
	int fd = -1;

	memcpy(&wire, handle.reserved, sizeof(wire));
	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!ptr)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "ptr is NULL");
	else if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%x: must be "
			     "CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS", flags);
	else if (memcmp(wire.magic, IPC_MAGIC, sizeof(wire.magic)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "the handle is not one "
			     "cuIpcGetMemHandle made");
	else if (wire.pid == getpid())
		r = contract(__func__, CU_ERROR_INVALID_CONTEXT, "the handle was exported by this "
			     "process: use the pointer it came from");
	if (r || (r = inject(FAIL_IPC_OPEN, __func__)))
		goto out;
	if ((l = ipc_open_of(&wire, ctx))) {
		l->opens++;
		*ptr = l->va;
		goto out;
	}
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)wire.pid, (int)wire.fd);
	if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0 || fstat(fd, &st) < 0 ||
	    st.st_ino != wire.ino || st.st_dev != wire.dev || (uint64_t)st.st_size != wire.size) {
		r = CU_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (!(l = linear_new(ctx, wire.physical, fd, wire.size))) {
		r = CU_ERROR_MAP_FAILED;
		goto out;
	}
	fd = -1;
	l->opened = true;
	l->opens = 1;
	*ptr = l->va;
out:
	if (fd >= 0)
		close(fd);
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "pid=%d fd=%d flags=0x%x -> 0x%llx", (int)wire.pid,
		     (int)wire.fd, flags, r ? 0 : *ptr);
}

static cu_result cuIpcCloseMemHandle(cu_deviceptr ptr)
{
	struct cu_ctx_st *ctx;
	struct linear *l;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	work_flush_all(); /* queued work lands before its memory goes */
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!(l = linear_at(ptr, true)))
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "0x%llx is not a pointer "
			     "cuIpcOpenMemHandle gave", ptr);
	else if (!--l->opens)
		linear_free(l);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "ptr=0x%llx", ptr);
}

/* ---------------------------------------------------- copies and sets */

enum direction { HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE };

struct copy {
	enum direction dir;
	cu_deviceptr dst, src;         /* the device ends */
	void *host_dst;                /* DEVICE_TO_HOST */
	const void *host_src;          /* HOST_TO_DEVICE */
	size_t bytes;
};

/* the copy, done at once, piece by piece as the mappings cut it; the
 * ranges are checked */
static void copy_bytes(const struct copy *c)
{
	const void *owner;
	const char *why;

	for (size_t done = 0, run; done < c->bytes; done += run) {
		size_t dst_run = c->bytes - done, src_run = c->bytes - done;
		char *to = c->dir == DEVICE_TO_HOST ? (char *)c->host_dst + done :
			device_bytes(c->dst + done, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, &dst_run,
				     &owner, &why);
		const char *from = c->dir == HOST_TO_DEVICE ? (const char *)c->host_src + done :
			device_bytes(c->src + done, CU_MEM_ACCESS_FLAGS_PROT_READ, &src_run,
				     &owner, &why);

		run = c->bytes - done;
		run = dst_run < run ? dst_run : run;
		run = src_run < run ? src_run : run;
		memmove(to, from, run);
	}
}

/*
 * Work the device finishes after the call returns, as the driver API's
 * synchronization rules allow: a copy from pageable memory to the device
 * (staged at the call, as the driver stages it), device to device, a
 * memset of device memory, every async copy to or from pinned memory. It
 * is queued on its stream and lands at that stream's next synchronization:
 * cuStreamSynchronize, cuCtxSynchronize, a call that waits for the legacy
 * stream (a synchronous copy to the host, or from pinned memory), or
 * before memory it touches goes (unmap, free). Until then no other process
 * sees it, and the host buffer of an async copy is read or written only
 * then: code that publishes or reads without the wait the driver requires
 * fails here as it would, by chance, on a GPU.
 */
struct work {
	struct work *next;
	struct copy c;
	bool fill;                     /* a memset: value of width bytes, count of them */
	unsigned int value;
	size_t width, count;
	void *staged;                  /* a pageable source, copied at the call */
	const struct cu_ctx_st *ctx;
	unsigned long long ctx_id;
	const struct cu_stream_st *stream; /* NULL: the context's legacy stream */
};

static struct work *work_head, **work_tail = &work_head;
static size_t work_pending;

static void fill_bytes(cu_deviceptr dst, unsigned int value, size_t width, size_t count);

static void work_run(struct work *w)
{
	if (w->fill)
		fill_bytes(w->c.dst, w->value, w->width, w->count);
	else
		copy_bytes(&w->c);
	free(w->staged);
	free(w);
	work_pending--;
}

/* does a synchronization of (@ctx, @stream) wait for @w? NULL: the legacy
 * stream, which waits for the context's blocking streams; @all: everything */
static bool work_waited(const struct work *w, const struct cu_ctx_st *ctx,
			const struct cu_stream_st *stream, bool legacy, bool all)
{
	if (all)
		return true;
	if (w->ctx != ctx || w->ctx_id != ctx->id)
		return false;
	if (!legacy && !stream)
		return true; /* the whole context */
	if (stream)
		return w->stream == stream;
	return !w->stream || !w->stream->nonblocking;
}

/* run, in order, the queued work a synchronization waits for */
static void work_flush(const struct cu_ctx_st *ctx, const struct cu_stream_st *stream,
		       bool legacy, bool all)
{
	struct work **pw = &work_head;

	while (*pw) {
		struct work *w = *pw;

		if (work_waited(w, ctx, stream, legacy, all)) {
			*pw = w->next;
			work_run(w);
		} else {
			pw = &w->next;
		}
	}
	for (work_tail = &work_head; *work_tail; work_tail = &(*work_tail)->next)
		;
}

/* before memory goes: whatever was queued lands first (the driver does not
 * let work outlive the memory it writes) */
static void work_flush_all(void)
{
	if (work_pending)
		work_flush(NULL, NULL, false, true);
}

/* @w queued on @stream (NULL or a special handle: the legacy stream) */
static cu_result work_queue(struct work *w, struct cu_ctx_st *ctx, cu_stream stream)
{
	struct cu_stream_st *st = stream && stream != STREAM_LEGACY && stream != STREAM_PER_THREAD
					  ? stream_lookup(stream) : NULL;

	w->ctx = ctx;
	w->ctx_id = ctx->id;
	w->stream = st;
	w->next = NULL;
	*work_tail = w;
	work_tail = &w->next;
	work_pending++;
	return CU_SUCCESS;
}

/* is [p, p + n) inside memory cuMemHostRegister pinned? */
static bool pinned(const void *p, size_t n)
{
	for (size_t i = 0; i < host_regs_used; i++)
		if (host_regs[i].in_use && (const char *)p >= host_regs[i].base &&
		    (uintptr_t)p + n <= (uintptr_t)host_regs[i].base + host_regs[i].size)
			return true;
	return false;
}

/*
 * every cuMemcpy*: the ranges checked, then the copy done now, or queued
 * (the comment above says which). @async: the *Async form, on @stream.
 */
static cu_result copy(const char *fn, const struct copy *c, bool async, cu_stream stream)
{
	struct cu_ctx_st *ctx;
	struct work *w = NULL;
	bool now;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(fn, &ctx)) || (async && (r = need_stream(fn, stream, ctx))))
		goto out;
	if (c->dir != DEVICE_TO_HOST &&
	    (r = need_device_range(fn, c->dst, c->bytes, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)))
		goto out;
	if (c->dir != HOST_TO_DEVICE &&
	    (r = need_device_range(fn, c->src, c->bytes, CU_MEM_ACCESS_FLAGS_PROT_READ)))
		goto out;
	if ((r = inject(FAIL_MEMCPY, fn)))
		goto out;
	switch (c->dir) {
	case DEVICE_TO_HOST:
		/* to pageable memory, or synchronous: done when it returns */
		now = !async || !pinned(c->host_dst, c->bytes);
		break;
	case HOST_TO_DEVICE:
		/* from pinned memory, synchronous: done when it returns */
		now = !async && pinned(c->host_src, c->bytes);
		break;
	default:
		now = false;
	}
	if (now) {
		/* in order after what the stream (the legacy one) has queued */
		work_flush(ctx, async ? stream_lookup(stream) : NULL, true, false);
		copy_bytes(c);
		goto out;
	}
	if (!(w = calloc(1, sizeof(*w)))) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	w->c = *c;
	if (c->dir == HOST_TO_DEVICE && !pinned(c->host_src, c->bytes)) {
		/* pageable: the driver stages the bytes before it returns */
		if (!(w->staged = malloc(c->bytes ? c->bytes : 1))) {
			free(w);
			r = CU_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		memcpy(w->staged, c->host_src, c->bytes);
		w->c.host_src = w->staged;
	}
	r = work_queue(w, ctx, async ? stream : NULL);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(fn, r, "dst=%#llx%s src=%#llx%s bytes=%zu stream=%p",
		     c->dir == DEVICE_TO_HOST ? (unsigned long long)(uintptr_t)c->host_dst : c->dst,
		     c->dir == DEVICE_TO_HOST ? " (host)" : "",
		     c->dir == HOST_TO_DEVICE ? (unsigned long long)(uintptr_t)c->host_src : c->src,
		     c->dir == HOST_TO_DEVICE ? " (host)" : "", c->bytes, (void *)stream);
}

static cu_result cuMemcpyHtoD(cu_deviceptr dst, const void *src, size_t bytes)
{
	const struct copy c = { .dir = HOST_TO_DEVICE, .dst = dst, .host_src = src, .bytes = bytes };

	return copy(__func__, &c, false, NULL);
}

static cu_result cuMemcpyDtoH(void *dst, cu_deviceptr src, size_t bytes)
{
	const struct copy c = { .dir = DEVICE_TO_HOST, .host_dst = dst, .src = src, .bytes = bytes };

	return copy(__func__, &c, false, NULL);
}

static cu_result cuMemcpyDtoD(cu_deviceptr dst, cu_deviceptr src, size_t bytes)
{
	const struct copy c = { .dir = DEVICE_TO_DEVICE, .dst = dst, .src = src, .bytes = bytes };

	return copy(__func__, &c, false, NULL);
}

static cu_result cuMemcpyHtoDAsync(cu_deviceptr dst, const void *src, size_t bytes,
				   cu_stream stream)
{
	const struct copy c = { .dir = HOST_TO_DEVICE, .dst = dst, .host_src = src, .bytes = bytes };

	return copy(__func__, &c, true, stream);
}

static cu_result cuMemcpyDtoHAsync(void *dst, cu_deviceptr src, size_t bytes, cu_stream stream)
{
	const struct copy c = { .dir = DEVICE_TO_HOST, .host_dst = dst, .src = src, .bytes = bytes };

	return copy(__func__, &c, true, stream);
}

static cu_result cuMemcpyDtoDAsync(cu_deviceptr dst, cu_deviceptr src, size_t bytes,
				   cu_stream stream)
{
	const struct copy c = { .dir = DEVICE_TO_DEVICE, .dst = dst, .src = src, .bytes = bytes };

	return copy(__func__, &c, true, stream);
}

/* @count values of @width bytes at @dst: the range was checked, and @dst
 * is aligned to @width, so a piece (which ends at a granule or allocation
 * end) never cuts a value */
static void fill_bytes(cu_deviceptr dst, unsigned int value, size_t width, size_t count)
{
	const void *owner;
	const char *why;

	for (size_t done = 0, run; done < count * width; done += run) {
		char *to = device_bytes(dst + done, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, &run,
					&owner, &why);

		run = run < count * width - done ? run : count * width - done;
		if (width == 1)
			memset(to, (int)value, run);
		for (size_t i = 0; width == 4 && i < run; i += 4)
			memcpy(to + i, &value, 4);
	}
}

/* every cuMemset*: @count values of @width bytes, queued (a memset of
 * device memory returns before it is done) */
static cu_result fill(const char *fn, cu_deviceptr dst, unsigned int value, size_t width,
		      size_t count, bool async, cu_stream stream)
{
	struct cu_ctx_st *ctx;
	struct work *w;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(fn, &ctx)) || (async && (r = need_stream(fn, stream, ctx))))
		goto out;
	if (count > SIZE_MAX / width)
		r = contract(fn, CU_ERROR_INVALID_VALUE, "%zu values overflow", count);
	else if (dst % width)
		r = contract(fn, CU_ERROR_INVALID_VALUE, "0x%llx is not aligned to %zu bytes", dst,
			     width);
	else
		r = need_device_range(fn, dst, count * width, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	if (r)
		goto out;
	if (!(w = calloc(1, sizeof(*w)))) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*w = (struct work){ .fill = true, .c.dst = dst, .value = value, .width = width,
			    .count = count };
	r = work_queue(w, ctx, async ? stream : NULL);
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(fn, r, "dst=0x%llx value=0x%x count=%zu stream=%p", dst, value, count,
		     (void *)stream);
}

static cu_result cuMemsetD8(cu_deviceptr dst, unsigned char value, size_t count)
{
	return fill(__func__, dst, value, 1, count, false, NULL);
}

static cu_result cuMemsetD32(cu_deviceptr dst, unsigned int value, size_t count)
{
	return fill(__func__, dst, value, 4, count, false, NULL);
}

static cu_result cuMemsetD32Async(cu_deviceptr dst, unsigned int value, size_t count,
				  cu_stream stream)
{
	return fill(__func__, dst, value, 4, count, true, stream);
}

/* ------------------------------------------------------------- streams */

static cu_result cuStreamCreate(cu_stream *stream, unsigned int flags)
{
	struct cu_stream_st *s = NULL;
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!stream)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "stream is NULL");
	else if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%x is neither "
			     "CU_STREAM_DEFAULT nor CU_STREAM_NON_BLOCKING", flags);
	else if (!(s = SLOT_NEW(streams)))
		r = CU_ERROR_OUT_OF_MEMORY;
	if (r)
		goto out;
	s->in_use = true;
	s->nonblocking = flags == CU_STREAM_NON_BLOCKING;
	s->ctx = ctx;
	s->ctx_id = ctx->id;
	*stream = s;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "flags=0x%x -> %p", flags, r ? NULL : (void *)*stream);
}

static cu_result cuStreamDestroy(cu_stream stream)
{
	struct cu_stream_st *s = NULL;
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_ctx(__func__, &ctx)) && !(s = stream_lookup(stream)))
		r = contract(__func__, CU_ERROR_INVALID_HANDLE, "stream %p is not a live stream "
			     "(destroyed already, or never created)", (void *)stream);
	else if (!r) {
		/* the driver finishes what the stream holds, then lets it go */
		work_flush(ctx, s, false, false);
		s->in_use = false;
	}
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "stream=%p", (void *)stream);
}

static cu_result cuStreamSynchronize(cu_stream stream)
{
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_ctx(__func__, &ctx)) && !(r = need_stream(__func__, stream, ctx))) {
		struct cu_stream_st *s = stream && stream != STREAM_LEGACY &&
						 stream != STREAM_PER_THREAD ? stream_lookup(stream)
									     : NULL;

		work_flush(ctx, s, true, false);
	}
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "stream=%p", (void *)stream);
}

/* -------------------------------------------------------- host memory */

/* bookkeeping only: nothing is locked in memory */
static cu_result cuMemHostRegister(void *p, size_t bytes, unsigned int flags)
{
	const unsigned int known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
				   HOST_REGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
	struct cu_ctx_st *ctx;
	struct host_reg *reg;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	if (!p || !bytes)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "%p+%zu is no range", p, bytes);
	else if (flags & ~known)
		r = contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%x: unknown bits 0x%x",
			     flags, flags & ~known);
	for (size_t i = 0; !r && i < host_regs_used; i++)
		if (host_regs[i].in_use && overlap((uintptr_t)p, bytes,
						   (uintptr_t)host_regs[i].base, host_regs[i].size))
			r = contract(__func__, CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "%p+%zu "
				     "overlaps the registration %p+%zu", p, bytes,
				     (void *)host_regs[i].base, host_regs[i].size);
	if (r || (r = inject(FAIL_HOST_REGISTER, __func__)))
		goto out;
	if (!(reg = SLOT_NEW(host_regs))) {
		r = CU_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	reg->in_use = true;
	reg->base = p;
	reg->size = bytes;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "p=%p bytes=%zu flags=0x%x", p, bytes, flags);
}

static cu_result cuMemHostUnregister(void *p)
{
	struct cu_ctx_st *ctx;
	cu_result r;
	size_t i;

	pthread_mutex_lock(&tables_lock);
	work_flush_all(); /* queued work lands before its memory goes */
	if ((r = need_ctx(__func__, &ctx)))
		goto out;
	for (i = 0; i < host_regs_used; i++)
		if (host_regs[i].in_use && host_regs[i].base == (char *)p)
			break;
	if (i == host_regs_used)
		r = contract(__func__, CU_ERROR_HOST_MEMORY_NOT_REGISTERED, "%p is not the base of "
			     "a registration", p);
	else
		host_regs[i].in_use = false;
out:
	pthread_mutex_unlock(&tables_lock);
	return trace(__func__, r, "p=%p", p);
}

/* ------------------------------------------------------------- kernels */

/* The stand-in runs no kernels: these exist so that a library that asks
 * for them loads, and say CU_ERROR_NOT_SUPPORTED after the usual checks. */
static cu_result no_kernels(const char *fn, bool has_stream, cu_stream stream)
{
	struct cu_ctx_st *ctx;
	cu_result r;

	pthread_mutex_lock(&tables_lock);
	if (!(r = need_ctx(fn, &ctx)) && has_stream)
		r = need_stream(fn, stream, ctx);
	pthread_mutex_unlock(&tables_lock);
	return trace(fn, r ? r : CU_ERROR_NOT_SUPPORTED, "%s", "the stand-in runs no kernels");
}

static cu_result cuModuleLoadData(void **module, const void *image)
{
	(void)module, (void)image;
	return no_kernels(__func__, false, NULL);
}

static cu_result cuModuleGetFunction(void **fn, void *module, const char *name)
{
	(void)fn, (void)module, (void)name;
	return no_kernels(__func__, false, NULL);
}

static cu_result cuFuncGetAttribute(int *value, int attr, void *fn)
{
	(void)value, (void)attr, (void)fn;
	return no_kernels(__func__, false, NULL);
}

static cu_result cuFuncSetAttribute(void *fn, int attr, int value)
{
	(void)fn, (void)attr, (void)value;
	return no_kernels(__func__, false, NULL);
}

static cu_result cuLaunchKernel(void *fn, unsigned int grid_x, unsigned int grid_y,
				unsigned int grid_z, unsigned int block_x, unsigned int block_y,
				unsigned int block_z, unsigned int shared_bytes, cu_stream stream,
				void **params, void **extra)
{
	(void)fn, (void)grid_x, (void)grid_y, (void)grid_z, (void)block_x, (void)block_y;
	(void)block_z, (void)shared_bytes, (void)params, (void)extra;
	return no_kernels(__func__, true, stream);
}

static cu_result cuMemAllocAsync(cu_deviceptr *ptr, size_t size, cu_stream stream)
{
	(void)ptr, (void)size;
	return no_kernels(__func__, true, stream);
}

static cu_result cuMemFreeAsync(cu_deviceptr ptr, cu_stream stream)
{
	(void)ptr;
	return no_kernels(__func__, true, stream);
}

/* ------------------------------------------------------- the exit check */

static pthread_once_t exit_check_once = PTHREAD_ONCE_INIT;
static bool strict;

struct left {
	unsigned count;
	unsigned long long first;      /* address or handle */
	size_t bytes;
};

static void leftover(struct left *l, unsigned long long first, size_t bytes)
{
	if (!l->count++) {
		l->first = first;
		l->bytes = bytes;
	}
}

/* "at exit: 2 mappings left (first at 0x7f..., 4194304 bytes)" */
static bool report_left(const struct left *l, const char *what, const char *first)
{
	if (l->count)
		say("at exit: %u %s (first %s0x%llx, %zu bytes)", l->count, what, first,
		    l->first, l->bytes);
	return l->count;
}

/*
 * At exit: what the process leaves behind, one line per kind, and its
 * breaches of the contract. KVA_CUDASTUB_STRICT turns them into the exit
 * status: 88 for a breach (it wins), 87 for anything left. Never runs in a
 * forked child that leaves by _exit; runs in one that calls exit, which
 * then answers for what it inherited.
 */
static void exit_check(void)
{
	struct left res = { 0 }, maps = { 0 }, handles = { 0 }, allocs_left = { 0 },
		    opens = { 0 }, regs = { 0 }, streams_left = { 0 }, ctxs = { 0 };
	bool dirty = false;
	unsigned breaches;

	pthread_mutex_lock(&tables_lock);
	for (size_t i = 0; i < reservations_used; i++)
		if (reservations[i].in_use)
			leftover(&res, reservations[i].va, reservations[i].size);
	for (size_t i = 0; i < mappings_used; i++)
		if (mappings[i].in_use)
			leftover(&maps, mappings[i].va, mappings[i].size);
	for (size_t i = 0; i < allocs_used; i++)
		if (allocs[i].in_use && allocs[i].handle_live)
			leftover(&handles, handle_of(&allocs[i]), allocs[i].size);
	for (size_t i = 0; i < linears_used; i++)
		if (linears[i].in_use)
			leftover(linears[i].opened ? &opens : &allocs_left, linears[i].va,
				 linears[i].size);
	for (size_t i = 0; i < host_regs_used; i++)
		if (host_regs[i].in_use)
			leftover(&regs, (uintptr_t)host_regs[i].base, host_regs[i].size);
	for (size_t i = 0; i < streams_used; i++)
		if (streams[i].in_use)
			leftover(&streams_left, (uintptr_t)&streams[i], 0);
	for (int i = 0; i < cfg.visible_count; i++)
		if (primary[i].retains)
			leftover(&ctxs, (unsigned long long)i, primary[i].retains);
	pthread_mutex_unlock(&tables_lock);

	dirty |= report_left(&res, "address reservations left", "at ");
	dirty |= report_left(&maps, "mappings left", "at ");
	dirty |= report_left(&handles, "allocation handles not released", "handle ");
	dirty |= report_left(&allocs_left, "cuMemAlloc allocations left", "at ");
	dirty |= report_left(&opens, "IPC opens not closed", "at ");
	dirty |= report_left(&regs, "host registrations left", "at ");
	if (streams_left.count)
		say("at exit: %u streams left (first %#llx)", streams_left.count,
		    streams_left.first);
	if (ctxs.count)
		say("at exit: %u primary contexts still retained (first: device %llu, %zu "
		    "retains)", ctxs.count, ctxs.first, ctxs.bytes);
	dirty |= streams_left.count || ctxs.count;

	pthread_mutex_lock(&report_lock);
	breaches = violations;
	if (breaches)
		say("at exit: %u contract violations (first: %s)", breaches, first_violation);
	pthread_mutex_unlock(&report_lock);
	if (!strict || (!breaches && !dirty))
		return;
	fflush(NULL);
	_exit(breaches ? 88 : 87);
}

static void register_exit_check(void)
{
	strict = env_flag("KVA_CUDASTUB_STRICT", false);
	atexit(exit_check);
}

static void arm_exit_check(void)
{
	pthread_once(&exit_check_once, register_exit_check);
}

/* ------------------------------------------------------ cuGetProcAddress */

#define DECLARE(name, params) static cu_result name params;
CUDASTUB_ENTRY_POINTS(DECLARE)
#undef DECLARE

EXPORT cu_result cuGetProcAddress CUDASTUB_GET_PROC_V1_PARAMS;
EXPORT cu_result cuGetProcAddress_v2 CUDASTUB_GET_PROC_V2_PARAMS;

typedef void (*any_fn)(void);

static const struct {
	const char *name;
	any_fn fn;
} entry_points[] = {
#define ENTRY(name, params) { #name, (any_fn)name },
	CUDASTUB_ENTRY_POINTS(ENTRY)
#undef ENTRY
	{ "cuGetProcAddress", (any_fn)cuGetProcAddress_v2 },
};

/* POSIX makes a function's address representable as a void *; ISO C has
 * no conversion between the two, so the representation is copied */
_Static_assert(sizeof(any_fn) == sizeof(void *), "function pointers are not void *");

/*
 * Only the 12.0 ABI is served: a caller that asks for an older version
 * gets VERSION_NOT_SUFFICIENT rather than a function with the wrong
 * signature.
 */
EXPORT cu_result cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
				     unsigned long long flags, int *status)
{
	const unsigned long long known = CU_GET_PROC_ADDRESS_LEGACY_STREAM |
					 GET_PROC_PER_THREAD_STREAM;
	int found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	cu_result r = CU_ERROR_NOT_FOUND;
	size_t i;

	if (!symbol || !pfn)
		return contract(__func__, CU_ERROR_INVALID_VALUE, "symbol or pfn is NULL");
	if (flags & ~known)
		return contract(__func__, CU_ERROR_INVALID_VALUE, "flags 0x%llx: unknown bits",
				flags);
	*pfn = NULL;
	for (i = 0; i < sizeof(entry_points) / sizeof(entry_points[0]); i++)
		if (!strcmp(entry_points[i].name, symbol))
			break;
	if (i < sizeof(entry_points) / sizeof(entry_points[0])) {
		if (version < CU_API_VERSION) {
			found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		} else {
			memcpy(pfn, &entry_points[i].fn, sizeof(*pfn));
			found = CU_GET_PROC_ADDRESS_SUCCESS;
			r = CU_SUCCESS;
		}
	}
	if (status)
		*status = found;
	return trace("cuGetProcAddress", r, "%s version=%d flags=0x%llx -> status %d", symbol,
		     version, flags, found);
}

EXPORT cu_result cuGetProcAddress(const char *symbol, void **pfn, int version,
				  unsigned long long flags)
{
	return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
