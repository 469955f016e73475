/* SPDX-License-Identifier: MIT */
/*
 * ctl_fixture.c - a worker process in known states, for kvarena-ctl's
 * picture and live view (test_ctl.py), and a reader of the blocks' states
 * through the public call the picture draws from.
 *
 *   ctl_fixture hold SOCKET
 *       attaches as worker A (a name with <&"'>, UTF-8 and U+FFFF), joins a
 *       second slot on its own as worker B (a name with control bytes), and
 *       builds, with no worker cache (so that every count is exact):
 *         A: 7 blocks owned; 3 blocks shared, which B references too;
 *            a pinned sequence of 3 full published blocks and a partial one
 *         B: 2 blocks owned; an inference sequence whose 2 blocks it
 *            published and closed (cached); an inference sequence holding
 *            the pinned sequence's first block by a match
 *       prints one JSON line naming the slots and the blocks, then obeys
 *       lines on stdin, answering each with one JSON line:
 *         close-pinned  close A's pinned sequence
 *         evict         take every block A can (evicting every cached one),
 *                       then free them
 *         quit          leave and exit
 *   ctl_fixture dump SOCKET
 *       one JSON line per block from kva_arena_block_states, as an observer
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvarena.h"

#define NAME_A "a<&\"'>\xc3\xa9\xe2\x82\xac\xef\xbf\xbf"
#define NAME_B "\x1b[2Jctl\n<b>"

static void die(const char *what, int err)
{
	fprintf(stderr, "ctl_fixture: %s: %s (%s)\n", what, strerror(-err), kva_errmsg());
	exit(1);
}

static void ids(const char *key, const uint32_t *v, size_t n, bool last)
{
	printf("\"%s\":[", key);
	for (size_t k = 0; k < n; k++)
		printf("%s%u", k ? "," : "", v[k]);
	printf("]%s", last ? "" : ",");
}

static void tokens(uint32_t family, size_t n, int32_t *out)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (int32_t)(family * 100003u + (uint32_t)i * 7u + 1u);
}

static int dump(const char *socket)
{
	struct kva_arena *a;
	struct kva_block_state *b;
	uint32_t blocks;
	int ret, n;

	if ((ret = kva_observe(socket, &a, NULL)) < 0)
		die("observe", ret);
	blocks = kva_arena_info(a)->blocks;
	if (!(b = calloc(blocks, sizeof(*b))))
		die("calloc", -ENOMEM);
	if ((n = kva_arena_block_states(a, 0, blocks, b)) != (int)blocks)
		die("block states", n < 0 ? n : -EIO);
	/* the call's edges: past the end, clipped, refused */
	if (kva_arena_block_states(a, blocks, 5, b) != 0 ||
	    kva_arena_block_states(a, blocks - 1, 5, b + blocks - 1) != 1 ||
	    kva_arena_block_states(a, blocks + 1, 1, b) != -EINVAL ||
	    kva_arena_block_states(NULL, 0, 1, b) != -EINVAL ||
	    kva_arena_block_states(a, 0, 1, NULL) != -EINVAL)
		die("block states: edges", -EPROTO);
	for (uint32_t k = 0; k < blocks; k++)
		printf("{\"id\":%u,\"kind\":%u,\"flags\":%u,\"slot\":%u,\"holders\":%u,"
		       "\"mask\":%llu,\"pins\":%u,\"epoch\":%u}\n", k, b[k].kind, b[k].flags,
		       b[k].slot, b[k].holders, (unsigned long long)b[k].holder_mask, b[k].pins,
		       b[k].epoch);
	free(b);
	kva_arena_close(a);
	return 0;
}

int main(int argc, char **argv)
{
	struct kva_seq_opts pin_o = { .kind = KVA_OWNER_PINNED, .model = "m" };
	struct kva_seq_opts inf_o = { .kind = KVA_OWNER_INFERENCE, .model = "m" };
	uint32_t owned_a[7], shared[3], owned_b[2], bt;
	struct kva_worker *wa, *wb;
	struct kva_seq *pin, *held, *s;
	const uint32_t *pin_ids, *cached_ids;
	size_t pin_n, n_tok, matched;
	uint32_t cached[2];
	int32_t *t;
	char line[64];
	int ret;

	if (argc == 3 && !strcmp(argv[1], "dump"))
		return dump(argv[2]);
	if (argc != 3 || strcmp(argv[1], "hold")) {
		fprintf(stderr, "usage: ctl_fixture hold|dump SOCKET\n");
		return 2;
	}
	if ((ret = kva_attach(argv[2], NAME_A, &wa)) < 0)
		die("attach", ret);
	/* a second slot of the same process, joined on its own: its name is
	 * not checked by the agent, as a scribbled one would not be */
	if ((ret = kva_worker_join(kva_worker_arena(wa), NAME_B, &wb)) < 0)
		die("join", ret);
	if ((ret = kva_worker_set_cache(wa, 0)) < 0 || (ret = kva_worker_set_cache(wb, 0)) < 0)
		die("set cache", ret);
	bt = kva_arena_info(kva_worker_arena(wa))->geometry.block_tokens;
	if (!(t = malloc(sizeof(*t) * bt * 8)))
		die("malloc", -ENOMEM);
	if ((ret = kva_alloc(wa, 7, owned_a)) < 0 || (ret = kva_alloc(wa, 3, shared)) < 0 ||
	    (ret = kva_share(wa, shared, 3)) < 0 || (ret = kva_free(wa, shared, 3)) < 0 ||
	    (ret = kva_share(wb, shared, 3)) < 0 || (ret = kva_alloc(wb, 2, owned_b)) < 0)
		die("alloc and share", ret);
	/* A's pinned sequence: 3 full blocks published, a partial one */
	tokens(1, 3 * bt + 2, t);
	if ((ret = kva_seq_open(wa, &pin_o, &pin)) < 0 ||
	    (ret = kva_seq_append(pin, t, 3 * bt + 2)) < 0)
		die("pinned sequence", ret);
	kva_seq_block_table(pin, &pin_ids, &pin_n, &n_tok);
	/* B: two blocks published and let go (cached) */
	tokens(2, 2 * bt, t);
	if ((ret = kva_seq_open(wb, &inf_o, &s)) < 0 || (ret = kva_seq_append(s, t, 2 * bt)) < 0)
		die("inference sequence", ret);
	kva_seq_block_table(s, &cached_ids, NULL, NULL);
	memcpy(cached, cached_ids, sizeof(cached));
	kva_seq_close(s);
	/* B holds the pinned sequence's first block through a match */
	tokens(1, bt, t);
	if ((ret = kva_seq_open(wb, &inf_o, &held)) < 0 ||
	    (ret = kva_seq_match(held, t, bt, &matched)) < 0 || matched != bt)
		die("match", ret < 0 ? ret : -ENOENT);
	printf("{\"slot_a\":%d,\"slot_b\":%d,\"block_tokens\":%u,", kva_worker_slot(wa),
	       kva_worker_slot(wb), bt);
	ids("owned_a", owned_a, 7, false);
	ids("shared", shared, 3, false);
	ids("owned_b", owned_b, 2, false);
	ids("pinned", pin_ids, pin_n, false);
	ids("cached", cached, 2, true);
	printf("}\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (!strcmp(line, "close-pinned\n")) {
			kva_seq_close(pin);
			pin = NULL;
			printf("{\"ok\":true}\n");
		} else if (!strcmp(line, "evict\n")) {
			uint32_t blocks = kva_arena_info(kva_worker_arena(wa))->blocks, got = 0;
			uint32_t *all = malloc(sizeof(*all) * blocks);

			while (all && got < blocks && kva_alloc(wa, 1, all + got) == 0)
				got++;
			if (all && got)
				kva_free(wa, all, got);
			free(all);
			printf("{\"ok\":true,\"taken\":%u}\n", got);
		} else if (!strcmp(line, "quit\n")) {
			break;
		} else {
			printf("{\"ok\":false}\n");
		}
		fflush(stdout);
	}
	if (pin)
		kva_seq_close(pin);
	kva_seq_close(held);
	kva_worker_leave(wb);
	kva_worker_leave(wa);
	free(t);
	return 0;
}
