/* SPDX-License-Identifier: MIT */
/*
 * fuzz_seeds.c - write one well-formed message of each type into DIR, as the
 * fuzzer's starting corpus: mutations of valid messages reach the per-type
 * checks that random bytes rarely do.
 */
#include <stdio.h>
#include <string.h>

#include "proto_pvt.h"

static int seed(const char *dir, const char *name, const union kva__msg *m, int nfds)
{
	char path[4096];
	unsigned char n = (unsigned char)nfds;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(&n, 1, 1, f) != 1 || fwrite(m, m->h.length, 1, f) != 1) {
		perror(path);
		return 1;
	}
	return fclose(f) != 0;
}

int main(int argc, char **argv)
{
	union kva__msg m;
	int bad = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: fuzz_seeds DIR\n");
		return 2;
	}
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = 4242;
	kva__msg_str(m.hello.name, sizeof(m.hello.name), "engine-0");
	bad |= seed(argv[1], "hello", &m, 0);
	m.hello.flags = KVA__HELLO_OBSERVER;
	bad |= seed(argv[1], "hello-observer", &m, 0);
	kva__msg_init(&m, KVA__MSG_WELCOME);
	m.welcome.slot = 5;
	m.welcome.generation = 3;
	m.welcome.agent_pid = 1;
	m.welcome.meta_bytes = 8192;
	m.welcome.data_bytes = 1 << 20;
	kva__msg_str(m.welcome.arena, sizeof(m.welcome.arena), "kvarena");
	bad |= seed(argv[1], "welcome", &m, 2);
	kva__msg_init(&m, KVA__MSG_REFUSE);
	m.refuse.reason = KVA__REFUSE_NOT_ALLOWED;
	kva__msg_str(m.refuse.text, sizeof(m.refuse.text), "uid 65534 is not allowed");
	bad |= seed(argv[1], "refuse", &m, 0);
	kva__msg_init(&m, KVA__MSG_SHUTDOWN);
	m.shutdown.grace_ms = 5000;
	bad |= seed(argv[1], "shutdown", &m, 0);
	kva__msg_init(&m, KVA__MSG_BYE);
	bad |= seed(argv[1], "bye", &m, 0);
	return bad;
}
