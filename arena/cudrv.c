/* SPDX-License-Identifier: MIT */
/*
 * cudrv.c - the CUDA driver, found at run time: dlopen("libcuda.so.1"),
 * dlsym of cuGetProcAddress alone, and every other entry point through it
 * at CU_API_VERSION, so the driver hands out the ABI the caller was written
 * against however new it is. libcuda is never linked, so every binary
 * starts, and works on host memory, where there is no driver.
 *
 * Two users fill their own tables with it: the kernels (kernels/cuda.c) and
 * the GPU data region (devmem.c).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "arena_pvt.h"
#include "cudrv_pvt.h"

/* cuGetProcAddress_v2 (CUDA 12+) has a status out-parameter; the first
 * cuGetProcAddress (CUDA 11.3..11.8) does not */
typedef cu_result (*get_proc_v2_fn)(const char *symbol, void **pfn, int version,
				    unsigned long long flags, int *status);
typedef cu_result (*get_proc_v1_fn)(const char *symbol, void **pfn, int version,
				    unsigned long long flags);

/* written once under lib_once, read-only after: the once publishes them */
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static get_proc_v2_fn get_proc_v2;
static get_proc_v1_fn get_proc_v1;
static char lib_why[200];

/* POSIX makes a data pointer from dlsym callable; ISO C has no conversion
 * between object and function pointers, so copy the representation */
_Static_assert(sizeof(void *) == sizeof(cu_result (*)(void)), "function pointers are not void *");

static void open_lib(void)
{
	/* the library stays loaded: the functions it gives point into it */
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *sym;

	if (!lib) {
		snprintf(lib_why, sizeof(lib_why), "no CUDA driver (libcuda.so.1 not found: %s)",
			 dlerror());
		return;
	}
	if ((sym = dlsym(lib, "cuGetProcAddress_v2")))
		memcpy(&get_proc_v2, &sym, sizeof(sym));
	else if ((sym = dlsym(lib, "cuGetProcAddress")))
		memcpy(&get_proc_v1, &sym, sizeof(sym));
	else
		snprintf(lib_why, sizeof(lib_why), "the CUDA driver is too old: libcuda.so.1 has "
			 "no cuGetProcAddress (CUDA 11.3)");
}

int kva__cu_load(const struct kva__cu_entry *e, size_t n, void *table, char *why, size_t len)
{
	pthread_once(&lib_once, open_lib);
	if (!get_proc_v2 && !get_proc_v1) {
		snprintf(why, len, "%s", lib_why);
		return -ENODEV;
	}
	for (size_t i = 0; i < n; i++) {
		void *sym = NULL;
		int status = 0;
		cu_result r;

		r = get_proc_v2 ? get_proc_v2(e[i].name, &sym, CU_API_VERSION,
					      CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
				: get_proc_v1(e[i].name, &sym, CU_API_VERSION,
					      CU_GET_PROC_ADDRESS_LEGACY_STREAM);
		if (r == CU_ERROR_NOT_A_DRIVER) {
			snprintf(why, len, "no CUDA driver (libcuda.so.1 is the toolkit's link-time "
				 "library, CUresult %d)", r);
			return -ENODEV;
		}
		if (r == CU_SUCCESS && status == 0 && sym) {
			memcpy((char *)table + e[i].offset, &sym, sizeof(sym));
			continue;
		}
		if (e[i].optional)
			continue;
		if (r != CU_SUCCESS && r != CU_ERROR_NOT_FOUND)
			snprintf(why, len, "cuGetProcAddress(%s) failed (CUresult %d)", e[i].name, r);
		else
			snprintf(why, len, "the CUDA driver has no %s: it is older than CUDA 12.0",
				 e[i].name);
		return -ENODEV;
	}
	return 0;
}
