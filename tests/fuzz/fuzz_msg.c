/* SPDX-License-Identifier: MIT */
/*
 * fuzz_msg.c - libFuzzer target for the protocol decoder. The first input
 * byte is the number of fds the message "came with"; the rest is the
 * message. What must hold for every input: the decoder returns 0 or -EPROTO
 * and nothing else; what it accepts is exactly the input, of its type's
 * size; and what it accepted decodes again to itself.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pvt.h"
#include "proto_pvt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	union kva__msg out, again;
	int nfds, ret;

	if (size < 1)
		return 0;
	nfds = data[0] % 4;
	data++;
	size--;
	ret = kva__msg_decode(data, size, nfds, &out);
	if (ret != 0 && ret != -EPROTO)
		abort();
	if (ret == 0) {
		if (out.h.length != size || memcmp(&out, data, size) != 0)
			abort();
		if (kva__msg_decode(&out, size, nfds, &again) != 0 || memcmp(&out, &again, size))
			abort();
	}
	return 0;
}
