/* SPDX-License-Identifier: MIT */
/* record_avx512.c - record copies and hashes with AVX-512 (record_isa.h) */
#define REC_ISA avx512
#define XXH_VECTOR XXH_AVX512
#include "record_isa.h"
