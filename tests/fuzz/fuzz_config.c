/* SPDX-License-Identifier: MIT */
/*
 * fuzz_config.c - libFuzzer target for kvarena-agent's configuration: its
 * flags and its config file, the agent's own parser (agent/config.c). The
 * first input byte chooses: even, the rest is a config file (read through
 * --config from a memfd); odd, the rest is the command line, NUL-separated.
 * What must hold for every input: the parser returns 0, 1 (--help) or
 * -EINVAL, never crashes, and what it accepts is in range.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent_pvt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* an accepted configuration is one the agent can run with */
static void check(const struct agent_config *c)
{
	const struct kva_geometry *g = &c->geometry;

	if (!memchr(c->socket, 0, sizeof(c->socket)) || !c->socket[0] ||
	    !memchr(c->name, 0, sizeof(c->name)) || !c->name[0])
		abort();
	if (c->max_workers < 1 || c->max_workers > KVA_MAX_WORKERS || !c->max_slots_pid ||
	    !c->max_slots_uid || c->max_slots_pid > c->max_workers ||
	    c->max_slots_uid > c->max_workers)
		abort();
	if (!c->max_pending || !c->max_pending_uid || !c->hello_timeout_ms ||
	    c->hello_timeout_ms > 60000 || c->shutdown_grace_ms > 3600000 ||
	    c->check_interval_ms > 3600000)
		abort();
	if (!g->block_tokens || g->block_tokens > 65536 || !g->layers || g->layers > 4096 ||
	    !g->kv_heads || g->kv_heads > 4096 || !g->head_dim || g->head_dim > 65536)
		abort();
	if ((!c->blocks && !c->memory) || c->blocks > KVA_MAX_BLOCKS)
		abort();
	if (c->n_allow_uid > AGENT_MAX_IDS || c->n_allow_gid > AGENT_MAX_IDS ||
	    (!c->n_allow_uid && !c->n_allow_gid))
		abort();
	if (c->log_level < LOG_ERR || c->log_level > LOG_DEBUG)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_config c;
	char *argv[34], *buf, path[64];
	int argc = 1, ret, fd = -1;

	if (size < 1 || size > 4096)
		return 0;
	argv[0] = "kvarena-agent";
	buf = malloc(size);
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	if (data[0] & 1) { /* a command line */
		for (char *p = buf; p < buf + size - 1 && argc < 33; p += strlen(p) + 1)
			argv[argc++] = p;
	} else { /* a config file */
		fd = memfd_create("fuzz.conf", MFD_CLOEXEC);
		if (fd < 0 || write(fd, data + 1, size - 1) != (ssize_t)(size - 1))
			abort();
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		argv[argc++] = "--config";
		argv[argc++] = path;
	}
	argv[argc] = NULL;
	ret = agent_config_parse(argc, argv, &c);
	if (ret != 0 && ret != 1 && ret != -EINVAL)
		abort();
	if (ret == 0)
		check(&c);
	if (fd >= 0)
		close(fd);
	free(buf);
	return 0;
}
