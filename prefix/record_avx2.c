/* SPDX-License-Identifier: MIT */
/* record_avx2.c - record copies and hashes with AVX2 (record_isa.h) */
#define REC_ISA avx2
#define XXH_VECTOR XXH_AVX2
#include "record_isa.h"
