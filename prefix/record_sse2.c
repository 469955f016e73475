/* SPDX-License-Identifier: MIT */
/* record_sse2.c - record copies and hashes with SSE2, every x86-64's (record_isa.h) */
#define REC_ISA sse2
#define XXH_VECTOR XXH_SSE2
#include "record_isa.h"
