/* SPDX-License-Identifier: MIT */
/*
 * test_cudastub.c - the CUDA driver stand-in (cudastub.c) itself: that it
 * serves the driver over shareable memory, and that it holds its callers
 * to the API's contract as it says.
 *
 * The stand-in reads its environment once per process, at cuInit, and
 * counts contract breaches for the life of the process, so every case runs
 * in a child of its own: the child sets the environment, dlopen()s the
 * library by its path, takes every entry point through
 * cuGetProcAddress_v2, runs, and leaves by exit(), which runs the
 * stand-in's exit check under KVA_CUDASTUB_STRICT=1. A child that breaks
 * the contract on purpose must then exit 88; a clean one 0; what it said
 * on stderr is kept for the test to read. Inside a child CHECK, not
 * cmocka's asserts (whose longjmp belongs to the parent), says what failed
 * and _exit(1)s.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cudrv_pvt.h"
#include "cudastub_pvt.h"

#ifndef CUDASTUB_PATH
#error "CUDASTUB_PATH: the built libcuda.so.1, from meson"
#endif

/* the entry points, as a program has them from cuGetProcAddress */
static struct driver {
#define MEMBER(name, params) cu_result (*name) params;
	CUDASTUB_ENTRY_POINTS(MEMBER)
#undef MEMBER
} cu;

static const struct {
	const char *name;
	size_t offset;
} entries[] = {
#define ENTRY(name, params) { #name, offsetof(struct driver, name) },
	CUDASTUB_ENTRY_POINTS(ENTRY)
#undef ENTRY
};

typedef cu_result (*get_proc_v1_fn) CUDASTUB_GET_PROC_V1_PARAMS;
typedef cu_result (*get_proc_v2_fn) CUDASTUB_GET_PROC_V2_PARAMS;

static void *lib;
static get_proc_v2_fn get_proc;

/* ----------------------------------------------------- in the children */

static void child_failed(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void child_failed(int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "test_cudastub.c:%d: CHECK failed: ", line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	_exit(1);
}

#define CHECK(cond) do { \
	if (!(cond)) \
		child_failed(__LINE__, "%s", #cond); \
} while (0)

/* @call returns @want */
#define CHECK_CU(call, want) do { \
	cu_result r_ = (call); \
	if (r_ != (want)) \
		child_failed(__LINE__, "%s returned %d, not %s (%d)", #call, r_, #want, want); \
} while (0)

/* POSIX makes a function's address representable as a void *; ISO C has
 * no conversion between the two, so the representation is copied */
_Static_assert(sizeof(void *) == sizeof(get_proc_v2_fn), "function pointers are not void *");

static void load(void)
{
	void *sym;
	int status;

	CHECK((lib = dlopen(CUDASTUB_PATH, RTLD_NOW | RTLD_LOCAL)));
	CHECK((sym = dlsym(lib, "cuGetProcAddress_v2")));
	memcpy(&get_proc, &sym, sizeof(sym));
	for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
		CHECK_CU(get_proc(entries[i].name, &sym, CU_API_VERSION,
				  CU_GET_PROC_ADDRESS_DEFAULT, &status), CU_SUCCESS);
		CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && sym);
		memcpy((char *)&cu + entries[i].offset, &sym, sizeof(sym));
	}
}

/* cuInit, and device @dev's primary context current */
static cu_context ctx_up(int dev)
{
	cu_context ctx;
	cu_device d;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK_CU(cu.cuDeviceGet(&d, dev), CU_SUCCESS);
	CHECK_CU(cu.cuDevicePrimaryCtxRetain(&ctx, d), CU_SUCCESS);
	CHECK_CU(cu.cuCtxPushCurrent(ctx), CU_SUCCESS);
	return ctx;
}

static void ctx_down(int dev)
{
	cu_context ctx;

	CHECK_CU(cu.cuCtxPopCurrent(&ctx), CU_SUCCESS);
	CHECK_CU(cu.cuDevicePrimaryCtxRelease(dev), CU_SUCCESS);
}

static cu_mem_allocation_prop prop_of(int dev, int handle_types)
{
	cu_mem_allocation_prop prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requested_handle_types = handle_types,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
	};

	return prop;
}

static size_t granularity(void)
{
	cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);
	size_t g;

	CHECK_CU(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CU_SUCCESS);
	return g;
}

static cu_mem_handle create(size_t size, int handle_types)
{
	cu_mem_allocation_prop prop = prop_of(0, handle_types);
	cu_mem_handle h;

	CHECK_CU(cu.cuMemCreate(&h, size, &prop, 0), CU_SUCCESS);
	return h;
}

static void set_access(cu_deviceptr va, size_t size, int flags)
{
	cu_mem_access_desc desc = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
		.flags = flags,
	};

	CHECK_CU(cu.cuMemSetAccess(va, size, &desc, 1), CU_SUCCESS);
}

/* device memory through VMM: one allocation mapped over one reservation */
struct vmm {
	cu_mem_handle handle;
	cu_deviceptr va;
	size_t size;
};

static struct vmm vmm_map(size_t size, int handle_types, int access)
{
	struct vmm v = { .handle = create(size, handle_types), .size = size };

	CHECK_CU(cu.cuMemAddressReserve(&v.va, size, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(v.va, size, 0, v.handle, 0), CU_SUCCESS);
	if (access != CU_MEM_ACCESS_FLAGS_PROT_NONE)
		set_access(v.va, size, access);
	return v;
}

static void vmm_unmap(const struct vmm *v)
{
	CHECK_CU(cu.cuMemUnmap(v->va, v->size), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(v->handle), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(v->va, v->size), CU_SUCCESS);
}

/* a write by the CPU to @p kills a process with SIGSEGV */
static bool touch_dies(volatile char *p)
{
	int status;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (!pid) {
		signal(SIGSEGV, SIG_DFL);
		*p = 1;
		_exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid);
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

/* the socket a pair of children talk over, one end each: each closes the
 * other's, so that one dying is the other's end of file, not a hang */
static int sock[2];

static int own_end(int mine)
{
	close(sock[!mine]);
	return sock[mine];
}

static void send_fd(int peer, int fd)
{
	char byte = 0, control[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);

	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
	CHECK(sendmsg(peer, &msg, 0) == 1);
}

static int recv_fd(int peer)
{
	char byte, control[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
			      .msg_controllen = sizeof(control) };
	struct cmsghdr *cmsg;
	int fd;

	CHECK(recvmsg(peer, &msg, 0) == 1);
	CHECK((cmsg = CMSG_FIRSTHDR(&msg)) && cmsg->cmsg_type == SCM_RIGHTS);
	memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
	return fd;
}

static void send_all(int peer, const void *buf, size_t len)
{
	CHECK(write(peer, buf, len) == (ssize_t)len);
}

static void recv_all(int peer, void *buf, size_t len)
{
	CHECK(read(peer, buf, len) == (ssize_t)len);
}

/* ------------------------------------------------------ in the parent */

struct child {
	pid_t pid;
	int err_fd;                    /* what it wrote on stderr */
	int status;
	char err[32768];
};

static const char *const stand_in_env[] = {
	"KVA_CUDASTUB_DEVICES", "KVA_CUDASTUB_MEMORY", "KVA_CUDASTUB_GRANULARITY",
	"KVA_CUDASTUB_RDMA", "KVA_CUDASTUB_NO_CPU", "KVA_CUDASTUB_FAIL", "KVA_CUDASTUB_LOG",
	"CUDA_VISIBLE_DEVICES",
};

/*
 * spawn - run @body in a child with the stand-in's environment cleared,
 * KVA_CUDASTUB_STRICT=1, then the NULL-terminated "NAME=value" list that
 * follows @body. The child leaves by exit(0) when @body returns.
 */
static void spawn(struct child *c, void (*body)(void), ...)
{
	va_list ap;

	memset(c, 0, sizeof(*c));
	c->err_fd = memfd_create("child-stderr", MFD_CLOEXEC);
	assert_true(c->err_fd >= 0);
	fflush(NULL);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid)
		return;
	dup2(c->err_fd, STDERR_FILENO);
	/* cmocka's handler would longjmp into the parent's test */
	signal(SIGSEGV, SIG_DFL);
	for (size_t i = 0; i < sizeof(stand_in_env) / sizeof(stand_in_env[0]); i++)
		unsetenv(stand_in_env[i]);
	setenv("KVA_CUDASTUB_STRICT", "1", 1);
	va_start(ap, body);
	for (const char *kv; (kv = va_arg(ap, const char *));)
		putenv((char *)kv);
	va_end(ap);
	load();
	body();
	exit(0);
}

/* wait for @c, keep what it said, and pass it on to the test's log */
static void reap(struct child *c)
{
	ssize_t len;

	assert_int_equal(waitpid(c->pid, &c->status, 0), c->pid);
	len = pread(c->err_fd, c->err, sizeof(c->err) - 1, 0);
	close(c->err_fd);
	c->err[len > 0 ? len : 0] = '\0';
	fprintf(stderr, "%s", c->err);
}

#define RUN(c, body, ...) do { \
	spawn(c, body, __VA_ARGS__); \
	reap(c); \
} while (0)

static void expect_exit(const struct child *c, int code)
{
	if (!WIFEXITED(c->status) || WEXITSTATUS(c->status) != code)
		fail_msg("child %s with %d, expected exit %d", WIFEXITED(c->status) ? "exited" :
			 "was killed", WIFEXITED(c->status) ? WEXITSTATUS(c->status) :
			 WTERMSIG(c->status), code);
}

static void expect_said(const struct child *c, const char *text)
{
	if (!strstr(c->err, text))
		fail_msg("the child did not say \"%s\"", text);
}

static void expect_not_said(const struct child *c, const char *text)
{
	if (strstr(c->err, text))
		fail_msg("the child said \"%s\"", text);
}

/* ----------------------------------------------------------- the tests */

static void only_get_proc_address_is_exported(void)
{
	get_proc_v1_fn v1;
	void *sym;
	int status = -1, version = 0;
	cu_result (*driver_get_version)(int *);

	CHECK(!dlsym(lib, "cuInit") && !dlsym(lib, "cuMemGetInfo_v2"));
	CHECK((sym = dlsym(lib, "cuGetProcAddress")));
	memcpy(&v1, &sym, sizeof(sym));
	/* base names only, at 12.0 or later */
	CHECK_CU(get_proc("cuMemGetInfo_v2", &sym, CU_API_VERSION, 0, &status),
		 CU_ERROR_NOT_FOUND);
	CHECK(!sym && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	CHECK_CU(get_proc("cuMemGetInfo", &sym, 11080, 0, &status), CU_ERROR_NOT_FOUND);
	CHECK(!sym && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	CHECK_CU(v1("cuDriverGetVersion", &sym, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM),
		 CU_SUCCESS);
	memcpy(&driver_get_version, &sym, sizeof(sym));
	/* answered before cuInit, as the real driver's */
	CHECK_CU(driver_get_version(&version), CU_SUCCESS);
	CHECK(version == 13000);
}

static void test_only_get_proc_address_is_exported(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, only_get_proc_address_is_exported, NULL);
	expect_exit(&c, 0);
}

static void calls_before_init(void)
{
	size_t free_bytes, total;

	CHECK_CU(cu.cuMemGetInfo(&free_bytes, &total), CU_ERROR_NOT_INITIALIZED);
	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
}

static void test_init_comes_first(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, calls_before_init, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemGetInfo: called before a successful cuInit");
}

static void map_then_touch(void)
{
	size_t g;
	struct vmm v;
	char buf[16];

	ctx_up(0);
	g = granularity();
	v = vmm_map(2 * g, CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	CHECK(touch_dies((char *)(uintptr_t)v.va));
	set_access(v.va, v.size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	memcpy((char *)(uintptr_t)v.va, "by the CPU", 11);
	CHECK_CU(cu.cuMemcpyDtoH(buf, v.va, 11), CU_SUCCESS);
	CHECK(!memcmp(buf, "by the CPU", 11));
	/* the first granule read-only, the second still read-write */
	set_access(v.va, g, CU_MEM_ACCESS_FLAGS_PROT_READ);
	CHECK(*(volatile char *)(uintptr_t)v.va == 'b');
	CHECK(touch_dies((char *)(uintptr_t)v.va));
	*(volatile char *)(uintptr_t)(v.va + g) = 1;
	set_access(v.va, v.size, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	CHECK(touch_dies((char *)(uintptr_t)(v.va + g)));
	vmm_unmap(&v);
	ctx_down(0);
}

static void copy_before_access(void)
{
	struct vmm v;

	ctx_up(0);
	v = vmm_map(granularity(), CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	CHECK_CU(cu.cuMemcpyHtoD(v.va, "x", 1), CU_ERROR_INVALID_VALUE);
	vmm_unmap(&v);
	ctx_down(0);
}

static void test_map_needs_access_before_the_cpu_may_touch(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, map_then_touch, NULL);
	expect_exit(&c, 0);
	/* nor may a copy */
	RUN(&c, copy_before_access, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemcpyHtoD: device range");
	expect_said(&c, "is mapped with no read-write access set");
}

static void free_while_mapped(void)
{
	struct vmm v;

	ctx_up(0);
	v = vmm_map(granularity(), CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK_CU(cu.cuMemAddressFree(v.va, v.size), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemAddressFree(v.va, v.size / 2), CU_ERROR_INVALID_VALUE);
	vmm_unmap(&v);
	ctx_down(0);
}

static void test_unmap_before_address_free(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, free_while_mapped, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemAddressFree: ");
	expect_said(&c, "unmap before freeing the address range");
	expect_said(&c, "is not a reservation");
	expect_said(&c, "at exit: 2 contract violations");
}

static void unmap_parts(void)
{
	size_t g;
	cu_mem_handle a, b;
	cu_deviceptr va;

	ctx_up(0);
	g = granularity();
	a = create(2 * g, CU_MEM_HANDLE_TYPE_NONE);
	b = create(g, CU_MEM_HANDLE_TYPE_NONE);
	CHECK_CU(cu.cuMemAddressReserve(&va, 4 * g, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va, 2 * g, 0, a, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va + 2 * g, g, 0, b, 0), CU_SUCCESS);
	/* half a mapping; a range running past the last one */
	CHECK_CU(cu.cuMemUnmap(va, g), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemUnmap(va, 4 * g), CU_ERROR_INVALID_VALUE);
	/* two whole mappings at once */
	CHECK_CU(cu.cuMemUnmap(va, 3 * g), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(a), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(b), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(va, 4 * g), CU_SUCCESS);
	ctx_down(0);
}

static void test_unmap_takes_whole_mappings(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, unmap_parts, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemUnmap: ");
	expect_said(&c, "at exit: 2 contract violations");
}

static void map_at_offset(void)
{
	size_t g;
	cu_mem_handle h;
	cu_deviceptr va;

	ctx_up(0);
	g = granularity();
	h = create(2 * g, CU_MEM_HANDLE_TYPE_NONE);
	CHECK_CU(cu.cuMemAddressReserve(&va, g, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va, g, g, h, 0), CU_ERROR_INVALID_VALUE);
	/* part of an allocation from its start is fine */
	CHECK_CU(cu.cuMemMap(va, g, 0, h, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemUnmap(va, g), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(h), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(va, g), CU_SUCCESS);
	ctx_down(0);
}

static void test_offset_must_be_zero(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, map_at_offset, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemMap: offset ");
	expect_said(&c, "at exit: 1 contract violations");
}

static void sizes_off_the_granules(void)
{
	cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);
	const size_t g = 64 << 10;
	cu_mem_handle h, bad;
	cu_deviceptr va, bad_va;
	size_t got;
	cu_mem_access_desc desc = { .location = prop.location, .flags = 3 };

	ctx_up(0);
	CHECK_CU(cu.cuMemGetAllocationGranularity(&got, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CU_SUCCESS);
	CHECK(got == g);
	CHECK_CU(cu.cuMemGetAllocationGranularity(&got, &prop,
						  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CU_SUCCESS);
	CHECK(got == 2 * g);
	CHECK_CU(cu.cuMemGetAllocationGranularity(&got, &prop, 7), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemCreate(&bad, g + 4096, &prop, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemCreate(&bad, 0, &prop, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemCreate(&h, g, &prop, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressReserve(&bad_va, 3 * g + 4096, 0, 0, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemAddressReserve(&bad_va, 4 * g, 3, 0, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemAddressReserve(&va, 4 * g, 0, 0, 0), CU_SUCCESS);
	CHECK(va % g == 0);
	CHECK_CU(cu.cuMemMap(va + 4096, g, 0, h, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemMap(va, g - 4096, 0, h, 0), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemMap(va + g, g, 0, h, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemSetAccess(va + g, 4096, &desc, 1), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemUnmap(va + g, g), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(h), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(va, 4 * g), CU_SUCCESS);
	ctx_down(0);
}

static void test_sizes_by_granularity(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, sizes_off_the_granules, "KVA_CUDASTUB_GRANULARITY=64K", NULL);
	expect_exit(&c, 88);
	expect_said(&c, "at exit: 8 contract violations (first: cuMemGetAllocationGranularity: "
		    "option 7");
	expect_said(&c, "contract: cuMemCreate: size 69632 is not a multiple of the minimum "
		    "granularity 65536");
	expect_said(&c, "contract: cuMemAddressReserve: alignment 3 is not a power of two");
	expect_said(&c, "contract: cuMemSetAccess: ");
}

static void export_both_kinds(void)
{
	cu_mem_handle none = create(granularity(), CU_MEM_HANDLE_TYPE_NONE), posix, imported;
	int fd = -1, again = -1;
	char link[64], target[64] = "";

	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, none, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						 0), CU_ERROR_INVALID_VALUE);
	posix = create(granularity(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, posix, 0x2 /* WIN32 */, 0),
		 CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, posix, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						 0), CU_SUCCESS);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	CHECK(readlink(link, target, sizeof(target) - 1) > 0);
	CHECK(!strncmp(target, "/memfd:cudastub-dev0", 20));
	/* an import may be exported again */
	CHECK_CU(cu.cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		 CU_SUCCESS);
	CHECK_CU(cu.cuMemExportToShareableHandle(&again, imported,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		 CU_SUCCESS);
	close(fd);
	close(again);
	CHECK_CU(cu.cuMemRelease(none), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(posix), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(imported), CU_SUCCESS);
}

static void export_needs(void)
{
	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	export_both_kinds();
}

static void test_export_needs_the_handle_type_asked_for(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, export_needs, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemExportToShareableHandle: 0x");
	expect_said(&c, "was created without asking for POSIX_FILE_DESCRIPTOR");
	expect_said(&c, "at exit: 2 contract violations");
}

static void import_other_fds(void)
{
	cu_mem_handle h;
	int fd = memfd_create("not-device-memory", MFD_CLOEXEC);

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK_CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		 CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)STDIN_FILENO,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		 CU_ERROR_INVALID_VALUE);
	close(fd);
}

static void test_import_takes_only_device_memory(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, import_other_fds, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemImportFromShareableHandle: fd ");
	expect_said(&c, "at exit: 2 contract violations");
}

static void release_twice(void)
{
	struct vmm v;
	char buf[6];

	ctx_up(0);
	v = vmm_map(granularity(), CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK_CU(cu.cuMemcpyHtoD(v.va, "alive", 6), CU_SUCCESS);
	/* legal while mapped: the memory lives until the mapping goes */
	CHECK_CU(cu.cuMemRelease(v.handle), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoH(buf, v.va, 6), CU_SUCCESS);
	CHECK(!strcmp(buf, "alive"));
	CHECK_CU(cu.cuMemRelease(v.handle), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemUnmap(v.va, v.size), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(v.va, v.size), CU_SUCCESS);
	ctx_down(0);
}

static void test_handle_released_twice_is_a_violation(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, release_twice, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemRelease: 0x");
	expect_said(&c, "at exit: 1 contract violations");
}

/* A makes the memory and maps it, B gets its fd over the socket and
 * writes into it, A sees the bytes */
static void share_fd_maker(void)
{
	struct vmm v;
	int fd;
	char done;

	int peer = own_end(0);

	ctx_up(0);
	v = vmm_map(granularity(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		    CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, v.handle,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		 CU_SUCCESS);
	send_fd(peer, fd);
	close(fd);
	recv_all(peer, &done, 1);
	CHECK(!strcmp((char *)(uintptr_t)v.va, "written by the other process"));
	CHECK(((char *)(uintptr_t)v.va)[v.size - 1] == 0x5a);
	vmm_unmap(&v);
	ctx_down(0);
}

static void share_fd_user(void)
{
	struct vmm v = { .size = 0 };
	int peer = own_end(1), fd;

	ctx_up(0);
	fd = recv_fd(peer);
	CHECK_CU(cu.cuMemImportFromShareableHandle(&v.handle, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		 CU_SUCCESS);
	close(fd);
	v.size = granularity();
	CHECK_CU(cu.cuMemAddressReserve(&v.va, v.size, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(v.va, v.size, 0, v.handle, 0), CU_SUCCESS);
	set_access(v.va, v.size, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	memset((char *)(uintptr_t)v.va, 0x5a, v.size);
	strcpy((char *)(uintptr_t)v.va, "written by the other process");
	vmm_unmap(&v);
	ctx_down(0);
	send_all(peer, "", 1);
}

static void test_fd_shared_with_another_process(void **state)
{
	struct child maker, user;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sock), 0);
	spawn(&maker, share_fd_maker, NULL);
	spawn(&user, share_fd_user, NULL);
	close(sock[0]);
	close(sock[1]);
	reap(&user);
	reap(&maker);
	expect_exit(&user, 0);
	expect_exit(&maker, 0);
}

/* A allocates and exports; B opens (twice), reads and writes; A sees it.
 * A second handle names memory A freed, whose fd number A's next
 * allocation took: B must not map the wrong memory. */
static void ipc_exporter(void)
{
	cu_ipc_mem_handle handles[2];
	cu_deviceptr mem, freed, reuse;
	char buf[32], done;
	int peer = own_end(0);

	ctx_up(0);
	CHECK_CU(cu.cuMemAlloc(&mem, (1 << 20) + 123), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyHtoD(mem, "from the exporter", 18), CU_SUCCESS);
	CHECK_CU(cu.cuIpcGetMemHandle(&handles[0], mem), CU_SUCCESS);
	CHECK_CU(cu.cuMemAlloc(&freed, 4096), CU_SUCCESS);
	CHECK_CU(cu.cuIpcGetMemHandle(&handles[1], freed), CU_SUCCESS);
	CHECK_CU(cu.cuMemFree(freed), CU_SUCCESS);
	CHECK_CU(cu.cuMemAlloc(&reuse, 4096), CU_SUCCESS);
	send_all(peer, handles, sizeof(handles));
	recv_all(peer, &done, 1);
	CHECK_CU(cu.cuMemcpyDtoH(buf, mem + (1 << 20), 20), CU_SUCCESS);
	CHECK(!strcmp(buf, "from the importer"));
	CHECK_CU(cu.cuMemFree(mem), CU_SUCCESS);
	CHECK_CU(cu.cuMemFree(reuse), CU_SUCCESS);
	ctx_down(0);
}

static void ipc_importer(void)
{
	cu_ipc_mem_handle handles[2];
	cu_deviceptr p, again, stale;
	char buf[32];
	int peer = own_end(1);

	ctx_up(0);
	recv_all(peer, handles, sizeof(handles));
	CHECK_CU(cu.cuIpcOpenMemHandle(&p, handles[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CU_SUCCESS);
	CHECK_CU(cu.cuIpcOpenMemHandle(&again, handles[0], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CU_SUCCESS);
	CHECK(again == p);
	CHECK_CU(cu.cuMemcpyDtoH(buf, p, 18), CU_SUCCESS);
	CHECK(!strcmp(buf, "from the exporter"));
	CHECK(*(char *)(uintptr_t)p == 'f');
	CHECK_CU(cu.cuMemcpyHtoD(p + (1 << 20), "from the importer", 18), CU_SUCCESS);
	/* opened twice: still open after one close */
	CHECK_CU(cu.cuIpcCloseMemHandle(p), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoH(buf, p, 1), CU_SUCCESS);
	CHECK_CU(cu.cuIpcCloseMemHandle(p), CU_SUCCESS);
	CHECK_CU(cu.cuIpcOpenMemHandle(&stale, handles[1], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CU_ERROR_INVALID_HANDLE);
	ctx_down(0);
	send_all(peer, "", 1);
}

static void test_legacy_ipc_across_processes(void **state)
{
	struct child exporter, importer;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sock), 0);
	spawn(&exporter, ipc_exporter, NULL);
	spawn(&importer, ipc_importer, NULL);
	close(sock[0]);
	close(sock[1]);
	reap(&importer);
	reap(&exporter);
	expect_exit(&importer, 0);
	expect_exit(&exporter, 0);
}

static void ipc_open_own(void)
{
	cu_ipc_mem_handle handle;
	cu_deviceptr mem, p;

	ctx_up(0);
	CHECK_CU(cu.cuMemAlloc(&mem, 4096), CU_SUCCESS);
	CHECK_CU(cu.cuIpcGetMemHandle(&handle, mem), CU_SUCCESS);
	CHECK_CU(cu.cuIpcOpenMemHandle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CU_ERROR_INVALID_CONTEXT);
	CHECK_CU(cu.cuMemFree(mem), CU_SUCCESS);
	ctx_down(0);
}

static void test_ipc_open_in_own_process_refused(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, ipc_open_own, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuIpcOpenMemHandle: the handle was exported by this process");
}

static void no_cpu_copies(void)
{
	struct vmm v;
	cu_deviceptr mem;
	char buf[16];

	ctx_up(0);
	v = vmm_map(granularity(), CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK_CU(cu.cuMemcpyHtoD(v.va, "through copies", 15), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoD(v.va + 100, v.va, 15), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoH(buf, v.va + 100, 15), CU_SUCCESS);
	CHECK(!strcmp(buf, "through copies"));
	CHECK_CU(cu.cuMemsetD8(v.va, 'z', 4), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoH(buf, v.va, 15), CU_SUCCESS);
	CHECK(!strcmp(buf, "zzzzugh copies"));
	CHECK_CU(cu.cuMemAlloc(&mem, 64), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoD(mem, v.va, 15), CU_SUCCESS);
	CHECK(touch_dies((char *)(uintptr_t)mem));
	signal(SIGSEGV, SIG_DFL);
	*(volatile char *)(uintptr_t)v.va = 1;
	_exit(0); /* not reached */
}

static void test_no_cpu_mode_segfaults_on_touch_but_copies_work(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, no_cpu_copies, "KVA_CUDASTUB_NO_CPU=1", NULL);
	assert_true(WIFSIGNALED(c.status));
	assert_int_equal(WTERMSIG(c.status), SIGSEGV);
	expect_not_said(&c, "CHECK failed");
}

static void create_three(void)
{
	cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);
	cu_mem_handle h[3];
	size_t g;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	g = granularity();
	CHECK_CU(cu.cuMemCreate(&h[0], g, &prop, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemCreate(&h[1], g, &prop, 0), CU_ERROR_OUT_OF_MEMORY);
	CHECK_CU(cu.cuMemCreate(&h[2], g, &prop, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(h[0]), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(h[2]), CU_SUCCESS);
}

static void test_injected_create_fails_the_nth(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, create_three, "KVA_CUDASTUB_FAIL=create:2,bogus", NULL);
	/* an injected failure is no breach */
	expect_exit(&c, 0);
	expect_said(&c, "injected: cuMemCreate #2 -> CUDA_ERROR_OUT_OF_MEMORY");
	expect_not_said(&c, "cuMemCreate #1");
	expect_not_said(&c, "cuMemCreate #3");
	expect_said(&c, "unknown failure 'bogus' ignored");
}

static int attribute(int attr)
{
	int value = -1;

	CHECK_CU(cu.cuDeviceGetAttribute(&value, attr, 0), CU_SUCCESS);
	return value;
}

static void without_vmm(void)
{
	cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);
	cu_mem_handle h;
	size_t g;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0);
	CHECK_CU(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CU_ERROR_NOT_SUPPORTED);
	CHECK_CU(cu.cuMemCreate(&h, 2 << 20, &prop, 0), CU_ERROR_NOT_SUPPORTED);
}

static void without_export(void)
{
	cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	cu_mem_handle h;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 1);
	CHECK(attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) == 0);
	CHECK(attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) == 0);
	CHECK_CU(cu.cuMemCreate(&h, granularity(), &prop, 0), CU_ERROR_NOT_SUPPORTED);
	h = create(granularity(), CU_MEM_HANDLE_TYPE_NONE);
	CHECK_CU(cu.cuMemRelease(h), CU_SUCCESS);
}

static void test_injected_unsupported_features(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, without_vmm, "KVA_CUDASTUB_FAIL=vmm:unsupported", NULL);
	expect_exit(&c, 0);
	expect_said(&c, "injected: cuMemCreate #2 -> CUDA_ERROR_NOT_SUPPORTED (vmm:unsupported)");
	RUN(&c, without_export, "KVA_CUDASTUB_FAIL=export:unsupported", "KVA_CUDASTUB_RDMA=0",
	    NULL);
	expect_exit(&c, 0);
	expect_said(&c, "injected: cuMemCreate #1 -> CUDA_ERROR_NOT_SUPPORTED "
		    "(export:unsupported)");
}

static void device_names(int count, const int *physical)
{
	int n = -1;
	cu_device dev;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK_CU(cu.cuDeviceGetCount(&n), CU_SUCCESS);
	CHECK(n == count);
	for (int i = 0; i < count; i++) {
		char name[64], want[64], bus[16], bus_want[16];
		cu_uuid uuid;

		CHECK_CU(cu.cuDeviceGet(&dev, i), CU_SUCCESS);
		CHECK_CU(cu.cuDeviceGetName(name, sizeof(name), dev), CU_SUCCESS);
		snprintf(want, sizeof(want), "kvarena CUDA driver stand-in (device %d)", physical[i]);
		CHECK(!strcmp(name, want));
		CHECK_CU(cu.cuDeviceGetUuid(&uuid, dev), CU_SUCCESS);
		CHECK(!memcmp(uuid.bytes, "kvastub-", 8) && uuid.bytes[15] == physical[i]);
		CHECK_CU(cu.cuDeviceGetPCIBusId(bus, sizeof(bus), dev), CU_SUCCESS);
		snprintf(bus_want, sizeof(bus_want), "0000:%02x:00.0", physical[i]);
		CHECK(!strcmp(bus, bus_want));
	}
	CHECK_CU(cu.cuDeviceGet(&dev, count), CU_ERROR_INVALID_DEVICE);
}

static void visible_2_0(void)
{
	const int physical[] = { 2, 0 };
	cu_mem_handle h;
	int fd;
	char link[64], target[64] = "";

	device_names(2, physical);
	/* memory of the program's device 0 is physical device 2's */
	h = create(granularity(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						 0), CU_SUCCESS);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	CHECK(readlink(link, target, sizeof(target) - 1) > 0);
	CHECK(!strncmp(target, "/memfd:cudastub-dev2", 20));
	close(fd);
	CHECK_CU(cu.cuMemRelease(h), CU_SUCCESS);
}

static void visible_1(void)
{
	const int physical[] = { 1 };

	device_names(1, physical);
}

static void visible_none(void)
{
	CHECK_CU(cu.cuInit(0), CU_ERROR_NO_DEVICE);
}

static void test_visible_devices_reorder_and_filter(void **state)
{
	struct child c;

	(void)state;
	/* the list ends at 7, which names no device */
	RUN(&c, visible_2_0, "KVA_CUDASTUB_DEVICES=4",
	    "CUDA_VISIBLE_DEVICES=2, GPU-6b766173-7475-622d-0000-000000000000,7,1", NULL);
	expect_exit(&c, 0);
	RUN(&c, visible_1, "KVA_CUDASTUB_DEVICES=2", "CUDA_VISIBLE_DEVICES=GPU-6b766173-7475-622d-"
	    "0000-000000000001", NULL);
	expect_exit(&c, 0);
	RUN(&c, visible_none, "KVA_CUDASTUB_DEVICES=2", "CUDA_VISIBLE_DEVICES=", NULL);
	expect_exit(&c, 0);
	/* a prefix of both UUIDs names neither */
	RUN(&c, visible_none, "KVA_CUDASTUB_DEVICES=2", "CUDA_VISIBLE_DEVICES=GPU-6b766173", NULL);
	expect_exit(&c, 0);
}

static void clean(void)
{
	ctx_up(0);
	ctx_down(0);
}

static void leave_a_reservation(void)
{
	cu_deviceptr va;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressReserve(&va, granularity(), 0, 0, 0), CU_SUCCESS);
}

static void break_the_contract(void)
{
	cu_context ctx;

	CHECK_CU(cu.cuInit(0), CU_SUCCESS);
	CHECK_CU(cu.cuCtxPopCurrent(&ctx), CU_ERROR_INVALID_CONTEXT);
}

static void leave_and_break(void)
{
	leave_a_reservation();
	break_the_contract();
}

static void leave_by_exit_without_check(void)
{
	leave_a_reservation();
	_exit(0);
}

static void test_strict_exit_codes(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, clean, NULL);
	expect_exit(&c, 0);
	expect_not_said(&c, "at exit");
	RUN(&c, leave_a_reservation, NULL);
	expect_exit(&c, 87);
	expect_said(&c, "at exit: 1 address reservations left (first at 0x");
	RUN(&c, break_the_contract, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "at exit: 1 contract violations (first: cuCtxPopCurrent: ");
	RUN(&c, leave_and_break, NULL);
	expect_exit(&c, 88);
	/* without STRICT the lines are said and the status is the process's */
	RUN(&c, leave_and_break, "KVA_CUDASTUB_STRICT=0", NULL);
	expect_exit(&c, 0);
	expect_said(&c, "at exit: 1 address reservations left");
	expect_said(&c, "at exit: 1 contract violations");
	/* _exit runs no check */
	RUN(&c, leave_by_exit_without_check, NULL);
	expect_exit(&c, 0);
	expect_not_said(&c, "at exit");
}

static size_t free_memory(void)
{
	size_t free_bytes = 0, total = 0;

	CHECK_CU(cu.cuMemGetInfo(&free_bytes, &total), CU_SUCCESS);
	CHECK(total == 64 << 20);
	return free_bytes;
}

static void count_memory(void)
{
	const size_t m = 1 << 20;
	cu_mem_handle big, shared, imported;
	cu_deviceptr mem;
	struct vmm v;
	int fd;

	ctx_up(0);
	CHECK(free_memory() == 64 * m);
	v = vmm_map(4 * m, CU_MEM_HANDLE_TYPE_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(free_memory() == 60 * m);
	CHECK_CU(cu.cuMemAlloc(&mem, m), CU_SUCCESS);
	CHECK(free_memory() == 59 * m);
	/* the mapping holds the memory after its handle is released */
	CHECK_CU(cu.cuMemRelease(v.handle), CU_SUCCESS);
	CHECK(free_memory() == 59 * m);
	CHECK_CU(cu.cuMemUnmap(v.va, v.size), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(v.va, v.size), CU_SUCCESS);
	CHECK(free_memory() == 63 * m);
	CHECK_CU(cu.cuMemFree(mem), CU_SUCCESS);
	CHECK(free_memory() == 64 * m);
	/* no more than there is; out of memory is no breach */
	{
		cu_mem_allocation_prop prop = prop_of(0, CU_MEM_HANDLE_TYPE_NONE);

		CHECK_CU(cu.cuMemCreate(&big, 66 * m, &prop, 0), CU_ERROR_OUT_OF_MEMORY);
		CHECK_CU(cu.cuMemAlloc(&mem, 65 * m), CU_ERROR_OUT_OF_MEMORY);
	}
	big = create(64 * m, CU_MEM_HANDLE_TYPE_NONE);
	CHECK(free_memory() == 0);
	CHECK_CU(cu.cuMemRelease(big), CU_SUCCESS);
	/* imports do not count */
	shared = create(2 * m, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CHECK_CU(cu.cuMemExportToShareableHandle(&fd, shared,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		 CU_SUCCESS);
	CHECK_CU(cu.cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		 CU_SUCCESS);
	close(fd);
	CHECK(free_memory() == 62 * m);
	CHECK_CU(cu.cuMemRelease(shared), CU_SUCCESS);
	CHECK(free_memory() == 64 * m);
	CHECK_CU(cu.cuMemRelease(imported), CU_SUCCESS);
	ctx_down(0);
}

static void test_meminfo_counts_what_this_process_created(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, count_memory, "KVA_CUDASTUB_MEMORY=64M", NULL);
	expect_exit(&c, 0);
}

static void use_after_release(void)
{
	unsigned long long first_id, second_id;
	size_t free_bytes, total;
	cu_context ctx, current;
	cu_stream stream;

	ctx = ctx_up(0);
	CHECK_CU(cu.cuCtxGetId(ctx, &first_id), CU_SUCCESS);
	CHECK_CU(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CU_SUCCESS);
	CHECK_CU(cu.cuDevicePrimaryCtxRelease(0), CU_SUCCESS);
	/* still on the stack, but gone */
	CHECK_CU(cu.cuCtxGetCurrent(&current), CU_SUCCESS);
	CHECK(current == ctx);
	CHECK_CU(cu.cuMemGetInfo(&free_bytes, &total), CU_ERROR_INVALID_CONTEXT);
	CHECK_CU(cu.cuDevicePrimaryCtxRelease(0), CU_ERROR_INVALID_CONTEXT);
	/* retained again it is a new context: the stream died with the old */
	CHECK_CU(cu.cuDevicePrimaryCtxRetain(&ctx, 0), CU_SUCCESS);
	CHECK_CU(cu.cuCtxGetId(ctx, &second_id), CU_SUCCESS);
	CHECK(second_id != first_id);
	CHECK_CU(cu.cuStreamSynchronize(stream), CU_ERROR_INVALID_HANDLE);
	ctx_down(0);
	CHECK_CU(cu.cuCtxPopCurrent(&current), CU_ERROR_INVALID_CONTEXT);
}

static void test_primary_context_released_is_unusable(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, use_after_release, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemGetInfo: the current context (device 0's primary) was "
		    "released");
	expect_said(&c, "contract: cuDevicePrimaryCtxRelease: ");
	expect_said(&c, "contract: cuCtxPopCurrent: no context is current");
	expect_said(&c, "at exit: 4 contract violations");
}

static void register_overlapping(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char *buf = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(buf != MAP_FAILED);
	ctx_up(0);
	CHECK_CU(cu.cuMemHostRegister(buf, 2 * page, CU_MEMHOSTREGISTER_PORTABLE), CU_SUCCESS);
	CHECK_CU(cu.cuMemHostRegister(buf + page, 2 * page, 0),
		 CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	CHECK_CU(cu.cuMemHostRegister(buf + 2 * page, 2 * page, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemHostRegister(buf + 2 * page, page, 0x10), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemHostUnregister(buf + page), CU_ERROR_HOST_MEMORY_NOT_REGISTERED);
	CHECK_CU(cu.cuMemHostUnregister(buf), CU_SUCCESS);
	CHECK_CU(cu.cuMemHostUnregister(buf + 2 * page), CU_SUCCESS);
	ctx_down(0);
	munmap(buf, 4 * page);
}

static void test_host_register_overlap(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, register_overlapping, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemHostRegister: ");
	expect_said(&c, "overlaps the registration");
	expect_said(&c, "contract: cuMemHostUnregister: ");
	expect_said(&c, "at exit: 3 contract violations");
}

static void copy_across_mappings(void)
{
	char src[256], dst[256];
	size_t g;
	cu_mem_handle a, b;
	cu_deviceptr va;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (char)i;
	ctx_up(0);
	g = granularity();
	a = create(g, CU_MEM_HANDLE_TYPE_NONE);
	b = create(g, CU_MEM_HANDLE_TYPE_NONE);
	CHECK_CU(cu.cuMemAddressReserve(&va, 3 * g, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va, g, 0, a, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va + g, g, 0, b, 0), CU_SUCCESS);
	set_access(va, 2 * g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	/* across the seam of two mappings; the memsets too */
	CHECK_CU(cu.cuMemcpyHtoD(va + g - 100, src, sizeof(src)), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoH(dst, va + g - 100, sizeof(dst)), CU_SUCCESS);
	CHECK(!memcmp(src, dst, sizeof(src)));
	CHECK(((char *)(uintptr_t)(va + g))[0] == 100);
	/* a memset lands at the next synchronization */
	CHECK_CU(cu.cuMemsetD32(va + g - 8, 0x01020304, 4), CU_SUCCESS);
	CHECK_CU(cu.cuCtxSynchronize(), CU_SUCCESS);
	CHECK(*(uint32_t *)(uintptr_t)(va + g + 4) == 0x01020304);
	/* into the hole after them, and misaligned */
	CHECK_CU(cu.cuMemcpyHtoD(va + 2 * g - 100, src, sizeof(src)), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemsetD32(va + 2, 0, 1), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuMemUnmap(va, 2 * g), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(a), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(b), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(va, 3 * g), CU_SUCCESS);
	ctx_down(0);
}

/*
 * What the driver may finish after the call returns lands at the stream's
 * next synchronization, and not before: seen through the CPU's view of the
 * memory, which is what another process mapping it sees too.
 */
static void work_lands_at_synchronization(void)
{
	static char pinned_buf[8192] __attribute__((aligned(4096)));
	char src[64], back[64];
	cu_stream stream, blocking;
	cu_mem_handle h;
	cu_deviceptr va;
	volatile char *cpu;
	size_t g;

	memset(src, 'n', sizeof(src));
	ctx_up(0);
	g = granularity();
	h = create(g, CU_MEM_HANDLE_TYPE_NONE);
	CHECK_CU(cu.cuMemAddressReserve(&va, g, 0, 0, 0), CU_SUCCESS);
	CHECK_CU(cu.cuMemMap(va, g, 0, h, 0), CU_SUCCESS);
	set_access(va, g, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	cpu = (volatile char *)(uintptr_t)va;
	/* from pageable memory: staged at the call (the source may change),
	 * landed at the legacy stream's synchronization */
	CHECK_CU(cu.cuMemcpyHtoD(va, src, sizeof(src)), CU_SUCCESS);
	memset(src, 'x', sizeof(src));
	CHECK(cpu[0] == 0);
	CHECK_CU(cu.cuStreamSynchronize(NULL), CU_SUCCESS);
	CHECK(cpu[0] == 'n' && cpu[63] == 'n');
	/* device to device, then a synchronous copy to the host: the legacy
	 * stream's work first, in order */
	CHECK_CU(cu.cuMemcpyDtoD(va + 100, va, 64), CU_SUCCESS);
	CHECK(cpu[100] == 0);
	CHECK_CU(cu.cuMemcpyDtoH(back, va + 100, 64), CU_SUCCESS);
	CHECK(back[0] == 'n' && cpu[163] == 'n');
	/* a non-blocking stream is not waited for by the legacy stream */
	CHECK_CU(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CU_SUCCESS);
	CHECK_CU(cu.cuMemsetD32Async(va + 256, 0x61616161, 4, stream), CU_SUCCESS);
	CHECK_CU(cu.cuStreamSynchronize(NULL), CU_SUCCESS);
	CHECK(cpu[256] == 0);
	CHECK_CU(cu.cuStreamSynchronize(stream), CU_SUCCESS);
	CHECK(cpu[256] == 'a');
	/* a blocking one is */
	CHECK_CU(cu.cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CU_SUCCESS);
	CHECK_CU(cu.cuMemsetD32Async(va + 512, 0x62626262, 4, blocking), CU_SUCCESS);
	CHECK(cpu[512] == 0);
	CHECK_CU(cu.cuStreamSynchronize(NULL), CU_SUCCESS);
	CHECK(cpu[512] == 'b');
	/* async into pinned memory: written at the synchronization, not the call */
	CHECK_CU(cu.cuMemHostRegister(pinned_buf, sizeof(pinned_buf), CU_MEMHOSTREGISTER_PORTABLE),
		 CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyDtoHAsync(pinned_buf, va, 64, stream), CU_SUCCESS);
	CHECK(pinned_buf[0] == 0);
	CHECK_CU(cu.cuStreamSynchronize(stream), CU_SUCCESS);
	CHECK(pinned_buf[0] == 'n');
	/* async from pinned memory: read at the synchronization, not the call */
	memset(pinned_buf, 'p', 64);
	CHECK_CU(cu.cuMemcpyHtoDAsync(va + 1024, pinned_buf, 64, stream), CU_SUCCESS);
	memset(pinned_buf, 'q', 64);
	CHECK_CU(cu.cuCtxSynchronize(), CU_SUCCESS);
	CHECK(cpu[1024] == 'q');
	/* queued work lands before its memory goes */
	CHECK_CU(cu.cuMemsetD32Async(va + 2048, 0, 4, stream), CU_SUCCESS);
	CHECK_CU(cu.cuStreamDestroy(stream), CU_SUCCESS);
	CHECK_CU(cu.cuStreamDestroy(blocking), CU_SUCCESS);
	CHECK_CU(cu.cuMemHostUnregister(pinned_buf), CU_SUCCESS);
	CHECK_CU(cu.cuMemUnmap(va, g), CU_SUCCESS);
	CHECK_CU(cu.cuMemRelease(h), CU_SUCCESS);
	CHECK_CU(cu.cuMemAddressFree(va, g), CU_SUCCESS);
	ctx_down(0);
}

static void test_work_lands_at_the_next_synchronization(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, work_lands_at_synchronization, NULL);
	expect_exit(&c, 0);
}

static void test_copy_spans_adjacent_mappings(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, copy_across_mappings, "KVA_CUDASTUB_GRANULARITY=4096", NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuMemcpyHtoD: device range");
	expect_said(&c, "is in no mapping");
	expect_said(&c, "at exit: 2 contract violations");
}

static void streams_twice(void)
{
	cu_stream stream;
	cu_deviceptr mem;

	ctx_up(0);
	CHECK_CU(cu.cuMemAlloc(&mem, 64), CU_SUCCESS);
	CHECK_CU(cu.cuStreamCreate(&stream, CU_STREAM_DEFAULT), CU_SUCCESS);
	CHECK_CU(cu.cuMemsetD32Async(mem, 7, 16, stream), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyHtoDAsync(mem, "s", 2, NULL), CU_SUCCESS);
	CHECK_CU(cu.cuStreamSynchronize(stream), CU_SUCCESS);
	CHECK_CU(cu.cuStreamCreate(&stream, 0x4), CU_ERROR_INVALID_VALUE);
	CHECK_CU(cu.cuStreamDestroy(stream), CU_SUCCESS);
	CHECK_CU(cu.cuMemcpyHtoDAsync(mem, "s", 2, stream), CU_ERROR_INVALID_HANDLE);
	CHECK_CU(cu.cuStreamDestroy(stream), CU_ERROR_INVALID_HANDLE);
	CHECK_CU(cu.cuMemFree(mem), CU_SUCCESS);
	ctx_down(0);
}

static void test_stream_destroyed_twice_is_a_violation(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, streams_twice, NULL);
	expect_exit(&c, 88);
	expect_said(&c, "contract: cuStreamDestroy: stream ");
	expect_said(&c, "at exit: 3 contract violations (first: cuStreamCreate: flags 0x4");
}

static void *other_thread(void *ctx)
{
	cu_context current = ctx;
	cu_device dev = -1;

	CHECK_CU(cu.cuCtxGetCurrent(&current), CU_SUCCESS);
	CHECK(!current);
	CHECK_CU(cu.cuCtxPushCurrent(ctx), CU_SUCCESS);
	CHECK_CU(cu.cuCtxGetDevice(&dev), CU_SUCCESS);
	CHECK(dev == 1);
	CHECK_CU(cu.cuCtxPopCurrent(&current), CU_SUCCESS);
	return NULL;
}

static void two_threads(void)
{
	cu_context first, second, current;
	pthread_t thread;

	first = ctx_up(0);
	CHECK_CU(cu.cuDevicePrimaryCtxRetain(&second, 1), CU_SUCCESS);
	CHECK(!pthread_create(&thread, NULL, other_thread, second));
	CHECK(!pthread_join(thread, NULL));
	CHECK_CU(cu.cuCtxGetCurrent(&current), CU_SUCCESS);
	CHECK(current == first);
	CHECK_CU(cu.cuDevicePrimaryCtxRelease(1), CU_SUCCESS);
	ctx_down(0);
}

static void test_context_stack_is_per_thread(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, two_threads, "KVA_CUDASTUB_DEVICES=2", NULL);
	expect_exit(&c, 0);
}

/* threads of one process at the tables at once (ThreadSanitizer's case) */
static void *churn(void *ctx)
{
	char want[64], got[64];
	size_t free_bytes, total;
	cu_context popped;

	CHECK_CU(cu.cuCtxPushCurrent(ctx), CU_SUCCESS);
	for (int round = 0; round < 100; round++) {
		struct vmm v = vmm_map(2 * 4096, CU_MEM_HANDLE_TYPE_NONE,
				       CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

		snprintf(want, sizeof(want), "thread %lu, round %d", (unsigned long)pthread_self(),
			 round);
		CHECK_CU(cu.cuMemcpyHtoD(v.va + 4000, want, sizeof(want)), CU_SUCCESS);
		CHECK_CU(cu.cuMemcpyDtoH(got, v.va + 4000, sizeof(got)), CU_SUCCESS);
		CHECK(!strcmp(got, want));
		CHECK_CU(cu.cuMemGetInfo(&free_bytes, &total), CU_SUCCESS);
		vmm_unmap(&v);
	}
	CHECK_CU(cu.cuCtxPopCurrent(&popped), CU_SUCCESS);
	return NULL;
}

static void threads_at_once(void)
{
	cu_context ctx = ctx_up(0);
	pthread_t threads[4];

	for (int i = 0; i < 4; i++)
		CHECK(!pthread_create(&threads[i], NULL, churn, ctx));
	for (int i = 0; i < 4; i++)
		CHECK(!pthread_join(threads[i], NULL));
	ctx_down(0);
}

static void test_threads_share_the_tables(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, threads_at_once, "KVA_CUDASTUB_GRANULARITY=4096", NULL);
	expect_exit(&c, 0);
}

static void test_log_says_every_call(void **state)
{
	struct child c;

	(void)state;
	RUN(&c, clean, "KVA_CUDASTUB_LOG=1", NULL);
	expect_exit(&c, 0);
	expect_said(&c, "cuInit(flags=0) -> CUDA_SUCCESS");
	expect_said(&c, "cuDevicePrimaryCtxRelease(dev=0) -> CUDA_SUCCESS");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_only_get_proc_address_is_exported),
		cmocka_unit_test(test_init_comes_first),
		cmocka_unit_test(test_map_needs_access_before_the_cpu_may_touch),
		cmocka_unit_test(test_unmap_before_address_free),
		cmocka_unit_test(test_unmap_takes_whole_mappings),
		cmocka_unit_test(test_offset_must_be_zero),
		cmocka_unit_test(test_sizes_by_granularity),
		cmocka_unit_test(test_export_needs_the_handle_type_asked_for),
		cmocka_unit_test(test_import_takes_only_device_memory),
		cmocka_unit_test(test_handle_released_twice_is_a_violation),
		cmocka_unit_test(test_fd_shared_with_another_process),
		cmocka_unit_test(test_legacy_ipc_across_processes),
		cmocka_unit_test(test_ipc_open_in_own_process_refused),
		cmocka_unit_test(test_no_cpu_mode_segfaults_on_touch_but_copies_work),
		cmocka_unit_test(test_injected_create_fails_the_nth),
		cmocka_unit_test(test_injected_unsupported_features),
		cmocka_unit_test(test_visible_devices_reorder_and_filter),
		cmocka_unit_test(test_strict_exit_codes),
		cmocka_unit_test(test_meminfo_counts_what_this_process_created),
		cmocka_unit_test(test_primary_context_released_is_unusable),
		cmocka_unit_test(test_host_register_overlap),
		cmocka_unit_test(test_copy_spans_adjacent_mappings),
		cmocka_unit_test(test_work_lands_at_the_next_synchronization),
		cmocka_unit_test(test_stream_destroyed_twice_is_a_violation),
		cmocka_unit_test(test_context_stack_is_per_thread),
		cmocka_unit_test(test_threads_share_the_tables),
		cmocka_unit_test(test_log_says_every_call),
	};

	return cmocka_run_group_tests_name("cudastub", tests, NULL, NULL);
}
