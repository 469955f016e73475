/* SPDX-License-Identifier: MIT */
/*
 * kvarena-bench - kvarena's benchmarks, one subcommand each. Every
 * subcommand prints its results as JSON objects, one per line, on stdout
 * (field names documented at the top of its file) and everything else on
 * stderr. Exit status: 0 done, 1 a measurement failed, 2 bad usage.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

static const struct subcommand {
	const char *name;
	const char *summary;
	int (*main)(int argc, char **argv); /* argv[0] is the subcommand's name */
} subcommands[] = {
	{ "alloc", "block get+put: kvarena against DPDK rte_mempool and a mutex free "
		   "list; reclaim of a killed worker", bench_alloc_main },
	{ "attach", "kva_attach and kva_detach against a real kvarena-agent, and a bare "
		    "connect() to it", bench_attach_main },
	{ "reclaim-agent", "SIGKILL of an attached worker until the agent has freed its "
			   "blocks", bench_reclaim_agent_main },
	{ "decode", "kva_decode over an arena against the read bandwidth of the same "
		    "threads and a naive decode; --backend cuda: kva_decode_cuda against "
		    "cuMemcpyDtoD", bench_decode_main },
	{ "spill", "the tiers below the arena (host memory, disk) against memcpy and raw "
		   "io_uring O_DIRECT I/O; --backend cuda: a GPU arena's host tier against "
		   "cuMemcpy", bench_spill_main },
};

#define N_SUBCOMMANDS (sizeof(subcommands) / sizeof(subcommands[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: kvarena-bench SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n\n");
	for (size_t k = 0; k < N_SUBCOMMANDS; k++)
		fprintf(f, "  %-14s %s\n", subcommands[k].name, subcommands[k].summary);
}

int main(int argc, char **argv)
{
	/* a child that died must turn a write to its pipe into EPIPE, not kill us */
	signal(SIGPIPE, SIG_IGN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	for (size_t k = 0; k < N_SUBCOMMANDS; k++)
		if (!strcmp(argv[1], subcommands[k].name))
			return subcommands[k].main(argc - 1, argv + 1);
	fprintf(stderr, "kvarena-bench: unknown subcommand '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
