/* SPDX-License-Identifier: MIT */
/*
 * error.c - a sentence about the last failure, per thread. Return codes carry
 * the errno; this carries which field, which slot, which size.
 *
 * The sentence is about the first cause: the cleanup after a failure (giving
 * a slot back, freeing what a half-done call took) runs under a hold, and
 * whatever it runs into does not replace the message the caller will read.
 */
#include <stdarg.h>
#include <stdio.h>

#include "arena_pvt.h"

static _Thread_local char errmsg[256];
static _Thread_local unsigned held;

int kva__err(int err, const char *fmt, ...)
{
	va_list ap;

	if (held)
		return err;
	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
	va_end(ap);
	return err;
}

void kva__err_clear(void)
{
	if (!held)
		errmsg[0] = '\0';
}

void kva__err_hold(bool on)
{
	held += on ? 1u : -1u;
}

const char *kva_errmsg(void)
{
	return errmsg;
}

#ifdef KVA_CRASH_POINTS
#include <signal.h>

static enum kva__crash_point armed;
static uint32_t countdown;
/* set by a test before the threads that pass the point run */
static _Atomic(kva__crash_hook_fn *) hook_fn;
static void *_Atomic hook_arg;
static _Atomic int hook_point;

void kva__crash_arm(enum kva__crash_point p, uint32_t nth)
{
	armed = p;
	countdown = nth;
}

void kva__crash_hook(enum kva__crash_point p, kva__crash_hook_fn *fn, void *arg)
{
	atomic_store(&hook_point, (int)p);
	atomic_store(&hook_arg, arg);
	atomic_store(&hook_fn, fn);
}

void kva__crash_point(enum kva__crash_point p)
{
	kva__crash_hook_fn *fn = atomic_load(&hook_fn);

	if (fn && (int)p == atomic_load(&hook_point))
		fn(p, atomic_load(&hook_arg));
	if (p == armed && countdown && --countdown == 0)
		raise(SIGKILL);
}
#endif
