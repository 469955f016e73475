/* SPDX-License-Identifier: MIT */
/*
 * config.c - kvarena-agent's flags and its config file, which has the same
 * keys: one "key = value" per line, '#' comments, flags without a value
 * written "key = true". The file is read first; the command line wins.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <arpa/inet.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "text.h"

enum opt {
	O_SOCKET = 256, O_SOCKET_MODE, O_SOCKET_GROUP, O_NAME, O_BACKEND, O_BLOCKS, O_MEMORY,
	O_BLOCK_TOKENS, O_LAYERS, O_KV_HEADS, O_HEAD_DIM, O_DTYPE, O_LAYOUT, O_HUGEPAGES,
	O_NUMA_NODE, O_MAX_WORKERS, O_WORKER_CACHE, O_ALLOW_UID, O_ALLOW_GID, O_LOG_LEVEL,
	O_SHUTDOWN_GRACE, O_CHECK_INTERVAL, O_EVICT_POLICY, O_QUOTA_INFERENCE, O_QUOTA_TRAINING,
	O_QUOTA_PINNED, O_TENANT_QUOTA, O_CACHE_LIMIT, O_MAX_PENDING, O_MAX_PENDING_UID,
	O_HELLO_TIMEOUT, O_MAX_SLOTS_PID, O_MAX_SLOTS_UID, O_ALLOW_OVERCOMMIT, O_PREFAULT,
	O_HOST_BYTES, O_HOST_NUMA_NODE, O_HOST_HUGEPAGES, O_DISK_DIR, O_DISK_BYTES, O_DISK_DIRECT,
	O_DISK_QD, O_DEVICE, O_MEMORY_FRACTION, O_CHUNK_BYTES, O_IPC, O_METRICS, O_CONFIG, O_HELP,
	O_VERSION,
};

static const struct option options[] = {
	{ "socket", required_argument, NULL, O_SOCKET },
	{ "socket-mode", required_argument, NULL, O_SOCKET_MODE },
	{ "socket-group", required_argument, NULL, O_SOCKET_GROUP },
	{ "name", required_argument, NULL, O_NAME },
	{ "backend", required_argument, NULL, O_BACKEND },
	{ "blocks", required_argument, NULL, O_BLOCKS },
	{ "memory", required_argument, NULL, O_MEMORY },
	{ "block-tokens", required_argument, NULL, O_BLOCK_TOKENS },
	{ "layers", required_argument, NULL, O_LAYERS },
	{ "kv-heads", required_argument, NULL, O_KV_HEADS },
	{ "head-dim", required_argument, NULL, O_HEAD_DIM },
	{ "dtype", required_argument, NULL, O_DTYPE },
	{ "layout", required_argument, NULL, O_LAYOUT },
	{ "hugepages", no_argument, NULL, O_HUGEPAGES },
	{ "numa-node", required_argument, NULL, O_NUMA_NODE },
	{ "max-workers", required_argument, NULL, O_MAX_WORKERS },
	{ "worker-cache", required_argument, NULL, O_WORKER_CACHE },
	{ "allow-uid", required_argument, NULL, O_ALLOW_UID },
	{ "allow-gid", required_argument, NULL, O_ALLOW_GID },
	{ "log-level", required_argument, NULL, O_LOG_LEVEL },
	{ "shutdown-grace", required_argument, NULL, O_SHUTDOWN_GRACE },
	{ "check-interval", required_argument, NULL, O_CHECK_INTERVAL },
	{ "evict-policy", required_argument, NULL, O_EVICT_POLICY },
	{ "cache-limit", required_argument, NULL, O_CACHE_LIMIT },
	{ "quota-inference", required_argument, NULL, O_QUOTA_INFERENCE },
	{ "quota-training", required_argument, NULL, O_QUOTA_TRAINING },
	{ "quota-pinned", required_argument, NULL, O_QUOTA_PINNED },
	{ "tenant-quota", required_argument, NULL, O_TENANT_QUOTA },
	{ "max-pending", required_argument, NULL, O_MAX_PENDING },
	{ "max-pending-per-uid", required_argument, NULL, O_MAX_PENDING_UID },
	{ "hello-timeout", required_argument, NULL, O_HELLO_TIMEOUT },
	{ "max-slots-per-pid", required_argument, NULL, O_MAX_SLOTS_PID },
	{ "max-slots-per-uid", required_argument, NULL, O_MAX_SLOTS_UID },
	{ "allow-overcommit", no_argument, NULL, O_ALLOW_OVERCOMMIT },
	{ "prefault", no_argument, NULL, O_PREFAULT },
	{ "host-bytes", required_argument, NULL, O_HOST_BYTES },
	{ "host-numa-node", required_argument, NULL, O_HOST_NUMA_NODE },
	{ "host-hugepages", required_argument, NULL, O_HOST_HUGEPAGES },
	{ "disk-dir", required_argument, NULL, O_DISK_DIR },
	{ "disk-bytes", required_argument, NULL, O_DISK_BYTES },
	{ "disk-direct", required_argument, NULL, O_DISK_DIRECT },
	{ "disk-queue-depth", required_argument, NULL, O_DISK_QD },
	{ "device", required_argument, NULL, O_DEVICE },
	{ "memory-fraction", required_argument, NULL, O_MEMORY_FRACTION },
	{ "chunk-bytes", required_argument, NULL, O_CHUNK_BYTES },
	{ "ipc", required_argument, NULL, O_IPC },
	{ "metrics", required_argument, NULL, O_METRICS },
	{ "config", required_argument, NULL, O_CONFIG },
	{ "help", no_argument, NULL, O_HELP },
	{ "version", no_argument, NULL, O_VERSION },
	{ NULL, 0, NULL, 0 },
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvarena-agent [options]\n"
"\n"
"Owns one KV-cache arena and admits worker processes to it over a Unix socket;\n"
"reclaims everything a worker held the moment it dies. Runs in the foreground.\n"
"\n"
"  --socket PATH          Unix socket to listen on (default: $KVARENA_SOCKET, else\n"
"                         %s; kvarena-ctl and kva_attach use the same default)\n"
"  --socket-mode MODE     octal file mode of the socket (default 0660)\n"
"  --socket-group GROUP   group of the socket file (name or gid)\n"
"  --name NAME            arena name shown by ops tools (default kvarena)\n"
"  --backend B            where the blocks live: host (default: a memfd) or cuda\n"
"                         (a GPU's memory; see below)\n"
"  --blocks N             number of blocks\n"
"  --memory SIZE          or: size of the data region (K, M, G, T suffixes);\n"
"                         default 128M\n"
"  --block-tokens N       tokens per block (default 16)\n"
"  --layers N             layers (default 4)\n"
"  --kv-heads N           KV heads (default 2)\n"
"  --head-dim N           head dimension (default 64)\n"
"  --dtype T              f32, f16, bf16, fp8_e4m3, int8 (default f16)\n"
"  --layout L             block-major (default) or layer-major\n"
"  --hugepages            back the data with 2 MiB huge pages if the system has them\n"
"  --numa-node N          bind the data region to NUMA node N (with --backend\n"
"                         cuda: the host tier's node)\n"
"  --max-workers N        worker slots, 1..%u (default %u)\n"
"  --worker-cache N       per-worker cache capacity in blocks (default: from the size)\n"
"  --allow-uid UID[,...]  users allowed to attach (names or numbers; repeatable);\n"
"                         default: the agent's own uid\n"
"  --allow-gid GID[,...]  groups allowed to attach (primary or supplementary)\n"
"  --log-level L          error, warn, info (default), debug\n"
"  --shutdown-grace S     seconds to wait for workers after SIGTERM (default 5)\n"
"  --check-interval S     seconds between arena checks (default 1; 0: never)\n"
"  --evict-policy P       which cached prefix blocks allocation takes first: prefix\n"
"                         (default: leaves, one-time blocks and stale ones first)\n"
"                         or clock (second chance)\n"
"  --cache-limit N        published prefix blocks (cached or held) at most; past\n"
"                         it a publication evicts a cached block first (0: no\n"
"                         limit: the cache takes whatever is free)\n"
"  --quota-inference N    blocks inference sequences may hold in all (0: no limit)\n"
"  --quota-training N     blocks training sequences may hold in all (0: no limit)\n"
"  --quota-pinned N       blocks pinned sequences may hold in all (0: no limit)\n"
"  --tenant-quota T:N     blocks tenant T's sequences may hold (repeatable, up to %u)\n"
"  --max-slots-per-pid N  worker slots one process may hold (default: a quarter of\n"
"                         the slots, at least 2)\n"
"  --max-slots-per-uid N  worker slots one user may hold (default: all when one uid\n"
"                         alone may attach, else three quarters)\n"
"  --max-pending N        connections that may wait for their HELLO (default 256);\n"
"                         past it the oldest silent one is closed\n"
"  --max-pending-per-uid N  of them, from one user (default 16)\n"
"  --hello-timeout S      seconds a connection has to say HELLO (default 2)\n"
"  --allow-overcommit     start even if the arena is larger than the memory of the\n"
"                         machine (or of --numa-node)\n"
"  --prefault             touch every page of the arena at start, so that the\n"
"                         memory is there (or start fails) before any worker\n"
"                         (always with tiers: the agent copies every block)\n",
		KVA_DEFAULT_SOCKET, KVA_MAX_WORKERS, KVA_MAX_WORKERS, KVA_MAX_TENANT_QUOTAS);
	fprintf(f,
"\n"
"Tiers below the arena: evicted prefix blocks go to host memory, then disk, and\n"
"come back on a prefix hit (kva_seq_fetch_*). The agent takes one worker slot.\n"
"  --host-bytes SIZE      the host DRAM tier (0: none; default none; K, M, G, T)\n"
"  --host-numa-node N     bind it to NUMA node N (default: --numa-node's)\n"
"  --host-hugepages B     true (default): on huge pages when the system has them\n"
"  --disk-dir DIR         the NVMe tier: one file, DIR/kvarena-NAME.tier, kept\n"
"                         across restarts (its records are found again)\n"
"  --disk-bytes SIZE      its size, preallocated (default 1G with --disk-dir)\n"
"  --disk-direct MODE     auto (default): O_DIRECT, or buffered I/O where the file\n"
"                         system does not take it (said in the log and by\n"
"                         kvarena-ctl tiers); require: refuse to start then; off\n"
"  --disk-queue-depth N   io_uring queue depth, 8..4096 (default 64)\n"
"\n"
"A GPU arena (--backend cuda): the blocks in one device's memory, shared with\n"
"every worker process on it; the metadata stays in host memory. Workers find\n"
"the device by UUID. libcuda is loaded at run time.\n"
"  --device D             the GPU: an ordinal (default 0) or its UUID (GPU-...)\n"
"  --memory-fraction F    or, instead of --blocks or --memory: this share (0..1]\n"
"                         of the device's free memory at start\n"
"  --chunk-bytes SIZE     the region is chunks of cuMemCreate, each exported as a\n"
"                         file descriptor (default 512M; rounded up to the\n"
"                         device's granularity)\n"
"  --ipc M                auto (default): POSIX fds where the device has them,\n"
"                         else legacy; fd: those or refuse to start; legacy: one\n"
"                         cuMemAlloc shared by cuIpcGetMemHandle\n"
"\n"
"Prometheus metrics (off by default): GET /metrics over HTTP, served by the\n"
"agent's own loop. Anyone who can reach the port can read them.\n"
"  --metrics ADDR         PORT: 127.0.0.1:PORT (loopback); IPV4:PORT; [IPV6]:PORT\n"
"                         (0.0.0.0:PORT or [::]:PORT: every address of the host);\n"
"                         port 0: any free port (the log says which); off: none\n"
"\n"
"  --config FILE          read these settings from FILE first: one \"key = value\"\n"
"                         per line, keys as the flags without dashes, each once\n"
"  --help, --version\n"
"\n"
"Signals: SIGTERM or SIGINT stop admitting, tell workers, wait --shutdown-grace,\n"
"remove the socket and exit 0. With NOTIFY_SOCKET set it tells systemd READY=1.\n");
}

static int bad(const char *key, const char *value, const char *why)
{
	fprintf(stderr, "kvarena-agent: --%s %s: %s\n", key, value, why);
	return -EINVAL;
}

static int parse_u64(const char *key, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long x;

	errno = 0;
	if (!*v || !isdigit((unsigned char)*v))
		return bad(key, v, "not a number");
	x = strtoull(v, &end, 10);
	if (errno || *end)
		return bad(key, v, "not a number");
	if (x < lo || x > hi) {
		char why[64];

		snprintf(why, sizeof(why), "out of range %" PRIu64 "..%" PRIu64, lo, hi);
		return bad(key, v, why);
	}
	*out = x;
	return 0;
}

static int parse_u32(const char *key, const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t x;
	int ret = parse_u64(key, v, lo, hi, &x);

	if (ret == 0)
		*out = (uint32_t)x;
	return ret;
}

static int parse_size(const char *key, const char *v, uint64_t *out)
{
	char *end;
	unsigned long long x;
	unsigned shift = 0;

	errno = 0;
	if (!isdigit((unsigned char)*v))
		return bad(key, v, "not a size");
	x = strtoull(v, &end, 10);
	if (errno)
		return bad(key, v, "not a size");
	switch (toupper((unsigned char)*end)) {
	case '\0': break;
	case 'K': shift = 10; break;
	case 'M': shift = 20; break;
	case 'G': shift = 30; break;
	case 'T': shift = 40; break;
	default: return bad(key, v, "not a size (K, M, G, T suffixes)");
	}
	if (*end && end[1] && strcasecmp(end + 1, "iB") && strcasecmp(end + 1, "B"))
		return bad(key, v, "not a size (K, M, G, T suffixes)");
	if (!x || x > (UINT64_MAX >> shift))
		return bad(key, v, "out of range");
	*out = (uint64_t)x << shift;
	return 0;
}

/* seconds, 0 or from a millisecond up to @max_s, as milliseconds (0 only if
 * @zero_ok): no NaN, no infinity, nothing that rounds to 0 by accident */
static int parse_seconds(const char *key, const char *v, uint32_t max_s, bool zero_ok,
			 uint32_t *ms)
{
	char *end;
	double s;

	errno = 0;
	s = strtod(v, &end);
	if (errno || *end || end == v || !isfinite(s))
		return bad(key, v, "not a number of seconds");
	if (s < 0 || s > max_s) {
		char why[64];

		snprintf(why, sizeof(why), "out of range 0..%u seconds", max_s);
		return bad(key, v, why);
	}
	if (s == 0 && !zero_ok)
		return bad(key, v, "must be more than 0 seconds");
	if (s != 0 && s < 0.001)
		return bad(key, v, "below a millisecond (0 means never)");
	*ms = (uint32_t)(s * 1000 + 0.5);
	return 0;
}

/* a comma-separated list of user (or group) names or numbers, none empty,
 * appended to @ids (@cap of them at most) */
static int parse_ids(const char *key, const char *v, bool group, uint32_t *ids, unsigned *n,
		     unsigned cap)
{
	char buf[512], *tok, *next;

	if (strlen(v) >= sizeof(buf))
		return bad(key, v, "too long");
	strcpy(buf, v);
	for (tok = buf; tok; tok = next) {
		uint64_t id;

		if ((next = strchr(tok, ',')))
			*next++ = '\0';
		if (!*tok)
			return bad(key, v, group ? "an empty group in the list" : "an empty user in the list");

		if (*n == cap)
			return bad(key, v, cap == 1 ? "one group, not a list" : "too many ids");
		if (isdigit((unsigned char)*tok)) {
			if (parse_u64(key, tok, 0, UINT32_MAX - 1, &id))
				return -EINVAL;
		} else if (group) {
			struct group *g = getgrnam(tok);

			if (!g)
				return bad(key, tok, "no such group");
			id = g->gr_gid;
		} else {
			struct passwd *p = getpwnam(tok);

			if (!p)
				return bad(key, tok, "no such user");
			id = p->pw_uid;
		}
		ids[(*n)++] = (uint32_t)id;
	}
	return 0;
}

/* a TCP port, 0 (any free one) to 65535: digits only */
static int parse_port(const char *key, const char *v, const char *port, uint16_t *out)
{
	size_t n = strlen(port);

	if (!n)
		return bad(key, v, "no port: PORT, IPV4:PORT or [IPV6]:PORT");
	if (strspn(port, "0123456789") != n)
		return bad(key, v, "the port is not a number");
	if (n > 5 || strtoul(port, NULL, 10) > 65535)
		return bad(key, v, "the port is out of range 0..65535");
	*out = (uint16_t)strtoul(port, NULL, 10);
	return 0;
}

/*
 * --metrics: where /metrics is served. "PORT" is 127.0.0.1:PORT: loopback
 * unless the operator names another address, since anyone who can reach the
 * port reads the arena's workers, names and counters. "IPV4:PORT",
 * "[IPV6]:PORT", "off". Addresses only: a name would be resolved once, at
 * start, to whatever the resolver said then. The family is set last: a
 * value refused half-way leaves AF_UNSPEC (off).
 */
static int parse_metrics(const char *key, const char *v, struct sockaddr_storage *out)
{
	struct sockaddr_in *sa4 = (struct sockaddr_in *)out;
	struct sockaddr_in6 *sa6 = (struct sockaddr_in6 *)out;
	const char *port, *close;
	char host[64];
	uint16_t p;
	size_t n;

	memset(out, 0, sizeof(*out));
	if (!strcmp(v, "off"))
		return 0;
	if (!*v)
		return bad(key, v, "empty: PORT, IPV4:PORT, [IPV6]:PORT or off");
	if (strspn(v, "0123456789") == strlen(v)) {
		if (parse_port(key, v, v, &p) < 0)
			return -EINVAL;
		sa4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sa4->sin_port = htons(p);
		sa4->sin_family = AF_INET;
		return 0;
	}
	if (*v == '[') {
		close = strchr(v, ']');
		if (!close || close[1] != ':')
			return bad(key, v, "an IPv6 address and its port are written [ADDR]:PORT");
		n = (size_t)(close - v - 1);
		if (n >= sizeof(host))
			return bad(key, v, "not an IPv6 address");
		memcpy(host, v + 1, n);
		host[n] = '\0';
		if (strchr(host, '%'))
			return bad(key, v, "a zone (%IFACE) is not taken: a global or loopback address");
		if (inet_pton(AF_INET6, host, &sa6->sin6_addr) != 1)
			return bad(key, v, "not an IPv6 address (names are not resolved)");
		if (parse_port(key, v, close + 2, &p) < 0)
			return -EINVAL;
		sa6->sin6_port = htons(p);
		sa6->sin6_family = AF_INET6;
		return 0;
	}
	port = strrchr(v, ':');
	if (!port)
		return bad(key, v, "not a port: PORT, IPV4:PORT or [IPV6]:PORT");
	n = (size_t)(port - v);
	if (memchr(v, ':', n))
		return bad(key, v, "an IPv6 address goes in brackets: [ADDR]:PORT");
	if (n >= sizeof(host))
		return bad(key, v, "not an IPv4 address");
	memcpy(host, v, n);
	host[n] = '\0';
	if (inet_pton(AF_INET, host, &sa4->sin_addr) != 1)
		return bad(key, v, "not an IPv4 address (names are not resolved: 127.0.0.1, "
			   "0.0.0.0, or the address of one interface)");
	if (parse_port(key, v, port + 1, &p) < 0)
		return -EINVAL;
	sa4->sin_port = htons(p);
	sa4->sin_family = AF_INET;
	return 0;
}

static int set_option(struct agent_config *c, int opt, const char *key, const char *v)
{
	uint64_t x;
	int ret = 0;

	switch (opt) {
	case O_SOCKET:
		if (!*v || strlen(v) >= sizeof(c->socket))
			return bad(key, v, "empty, or longer than a socket path may be");
		snprintf(c->socket, sizeof(c->socket), "%s", v);
		return 0;
	case O_SOCKET_MODE: {
		char *end;
		unsigned long m = strtoul(v, &end, 8);

		if (!*v || *end || m > 0777)
			return bad(key, v, "not an octal file mode (0600, 0660, ...)");
		c->socket_mode = (mode_t)m;
		return 0;
	}
	case O_SOCKET_GROUP: {
		uint32_t g[1];
		unsigned n = 0;

		if ((ret = parse_ids(key, v, true, g, &n, 1)) == 0)
			c->socket_group = g[0];
		return ret;
	}
	case O_NAME:
		if (!*v || strlen(v) >= sizeof(c->name))
			return bad(key, v, "empty, or longer than 31 bytes");
		snprintf(c->name, sizeof(c->name), "%s", v);
		return 0;
	case O_BACKEND:
		if (strcmp(v, "host") && strcmp(v, "cuda"))
			return bad(key, v, "host or cuda");
		snprintf(c->backend, sizeof(c->backend), "%s", v);
		return 0;
	/* --blocks, --memory and --memory-fraction size the arena: the last wins */
	case O_BLOCKS:
		c->memory_fraction = 0;
		return parse_u32(key, v, 1, KVA_MAX_BLOCKS, &c->blocks);
	case O_MEMORY:
		ret = parse_size(key, v, &c->memory);
		if (ret == 0) {
			c->blocks = 0;
			c->memory_fraction = 0;
		}
		return ret;
	case O_MEMORY_FRACTION: {
		char *end;
		double f;

		errno = 0;
		f = strtod(v, &end);
		if (errno || *end || end == v || !isfinite(f) || f <= 0 || f > 1)
			return bad(key, v, "a share of the device's free memory, above 0, 1 at most");
		c->memory_fraction = f;
		c->blocks = 0;
		return 0;
	}
	case O_DEVICE:
		if (!*v || strlen(v) >= sizeof(c->device) || !text_printable(v, sizeof(c->device) - 1))
			return bad(key, v, "an ordinal or a UUID (GPU-...)");
		snprintf(c->device, sizeof(c->device), "%s", v);
		return 0;
	case O_CHUNK_BYTES:
		return parse_size(key, v, &c->chunk_bytes);
	case O_IPC:
		if (!strcmp(v, "auto"))
			c->ipc = KVA_IPC_AUTO;
		else if (!strcmp(v, "fd"))
			c->ipc = KVA_IPC_FD;
		else if (!strcmp(v, "legacy"))
			c->ipc = KVA_IPC_LEGACY;
		else
			return bad(key, v, "auto, fd or legacy");
		return 0;
	case O_BLOCK_TOKENS:
		return parse_u32(key, v, 1, 65536, &c->geometry.block_tokens);
	case O_LAYERS:
		return parse_u32(key, v, 1, 4096, &c->geometry.layers);
	case O_KV_HEADS:
		return parse_u32(key, v, 1, 4096, &c->geometry.kv_heads);
	case O_HEAD_DIM:
		return parse_u32(key, v, 1, 65536, &c->geometry.head_dim);
	case O_DTYPE:
		if (kva_dtype_parse(v, &c->geometry.dtype) < 0)
			return bad(key, v, "one of f32, f16, bf16, fp8_e4m3, int8");
		return 0;
	case O_LAYOUT:
		if (!strcmp(v, "block-major"))
			c->geometry.layout = KVA_LAYOUT_BLOCK_MAJOR;
		else if (!strcmp(v, "layer-major"))
			c->geometry.layout = KVA_LAYOUT_LAYER_MAJOR;
		else
			return bad(key, v, "block-major or layer-major");
		return 0;
	case O_HUGEPAGES:
		if (v && strcmp(v, "true") && strcmp(v, "false"))
			return bad(key, v, "true or false");
		c->hugepages = !v || !strcmp(v, "true");
		return 0;
	case O_NUMA_NODE:
		if ((ret = parse_u64(key, v, 0, 1023, &x)) == 0)
			c->numa_node = (int32_t)x;
		return ret;
	case O_MAX_WORKERS:
		return parse_u32(key, v, 1, KVA_MAX_WORKERS, &c->max_workers);
	case O_WORKER_CACHE:
		return parse_u32(key, v, 0, 65536, &c->worker_cache);
	case O_ALLOW_UID:
		return parse_ids(key, v, false, c->allow_uid, &c->n_allow_uid, AGENT_MAX_IDS);
	case O_ALLOW_GID:
		return parse_ids(key, v, true, c->allow_gid, &c->n_allow_gid, AGENT_MAX_IDS);
	case O_LOG_LEVEL:
		if ((c->log_level = agent_log_level_parse(v)) < 0)
			return bad(key, v, "error, warn, info or debug");
		return 0;
	case O_SHUTDOWN_GRACE:
		return parse_seconds(key, v, 3600, true, &c->shutdown_grace_ms);
	case O_CHECK_INTERVAL:
		return parse_seconds(key, v, 3600, true, &c->check_interval_ms);
	case O_HELLO_TIMEOUT:
		return parse_seconds(key, v, 60, false, &c->hello_timeout_ms);
	case O_MAX_PENDING:
		return parse_u32(key, v, 1, 4096, &c->max_pending);
	case O_MAX_PENDING_UID:
		return parse_u32(key, v, 1, 4096, &c->max_pending_uid);
	case O_MAX_SLOTS_PID:
		return parse_u32(key, v, 1, KVA_MAX_WORKERS, &c->max_slots_pid);
	case O_MAX_SLOTS_UID:
		return parse_u32(key, v, 1, KVA_MAX_WORKERS, &c->max_slots_uid);
	case O_ALLOW_OVERCOMMIT:
	case O_PREFAULT: {
		bool *flag = opt == O_PREFAULT ? &c->prefault : &c->allow_overcommit;

		if (v && strcmp(v, "true") && strcmp(v, "false"))
			return bad(key, v, "true or false");
		*flag = !v || !strcmp(v, "true");
		return 0;
	}
	case O_HOST_BYTES:
		if (!strcmp(v, "0")) {
			c->tiers.host_bytes = 0;
			return 0;
		}
		return parse_size(key, v, &c->tiers.host_bytes);
	case O_HOST_NUMA_NODE:
		if ((ret = parse_u64(key, v, 0, 1023, &x)) == 0) {
			c->tiers.host_node = (int32_t)x;
			c->host_node_set = true;
		}
		return ret;
	case O_HOST_HUGEPAGES:
		if (strcmp(v, "true") && strcmp(v, "false"))
			return bad(key, v, "true or false");
		c->tiers.host_hugepages = !strcmp(v, "true");
		return 0;
	case O_DISK_DIR:
		if (!*v || strlen(v) >= sizeof(c->tiers.disk_dir) - 48)
			return bad(key, v, "empty, or too long a path");
		if (!text_printable(v, sizeof(c->tiers.disk_dir) - 1))
			return bad(key, v, "not printable");
		snprintf(c->tiers.disk_dir, sizeof(c->tiers.disk_dir), "%s", v);
		return 0;
	case O_DISK_BYTES:
		return parse_size(key, v, &c->tiers.disk_bytes);
	case O_DISK_DIRECT:
		if (!strcmp(v, "auto"))
			c->tiers.direct = TIER_DIRECT_AUTO;
		else if (!strcmp(v, "require"))
			c->tiers.direct = TIER_DIRECT_REQUIRE;
		else if (!strcmp(v, "off"))
			c->tiers.direct = TIER_DIRECT_OFF;
		else
			return bad(key, v, "auto, require or off");
		return 0;
	case O_DISK_QD:
		return parse_u32(key, v, 8, 4096, &c->tiers.queue_depth);
	case O_METRICS:
		return parse_metrics(key, v, &c->metrics_addr);
	case O_EVICT_POLICY:
		if (kva_evict_policy_parse(v, &c->evict_policy) < 0)
			return bad(key, v, "prefix or clock");
		return 0;
	case O_CACHE_LIMIT:
		return parse_u32(key, v, 0, KVA_MAX_BLOCKS, &c->cache_limit);
	case O_QUOTA_INFERENCE:
		return parse_u32(key, v, 0, KVA_MAX_BLOCKS, &c->quotas.kind[KVA_OWNER_INFERENCE]);
	case O_QUOTA_TRAINING:
		return parse_u32(key, v, 0, KVA_MAX_BLOCKS, &c->quotas.kind[KVA_OWNER_TRAINING]);
	case O_QUOTA_PINNED:
		return parse_u32(key, v, 0, KVA_MAX_BLOCKS, &c->quotas.kind[KVA_OWNER_PINNED]);
	case O_TENANT_QUOTA: {
		char tenant[16], *colon = strchr(v, ':');
		uint32_t t = 0, n = 0;
		unsigned i;

		if (!colon || (size_t)(colon - v) >= sizeof(tenant))
			return bad(key, v, "TENANT:BLOCKS, e.g. 7:4096");
		memcpy(tenant, v, (size_t)(colon - v));
		tenant[colon - v] = '\0';
		if ((ret = parse_u32(key, tenant, 0, UINT32_MAX, &t)) < 0 ||
		    (ret = parse_u32(key, colon + 1, 1, KVA_MAX_BLOCKS, &n)) < 0)
			return ret;
		for (i = 0; i < KVA_MAX_TENANT_QUOTAS; i++)
			if (!c->quotas.tenant[i].blocks || c->quotas.tenant[i].tenant == t)
				break;
		if (i == KVA_MAX_TENANT_QUOTAS)
			return bad(key, v, "more tenant quotas than the arena keeps");
		c->quotas.tenant[i].tenant = t;
		c->quotas.tenant[i].blocks = n;
		return 0;
	}
	default:
		return -EINVAL;
	}
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/*
 * read_config - "key = value" lines. Refused, naming the file and line: a
 * path that is not a regular file, a NUL byte, a line over 1 KiB, a line
 * without "=", an unknown key, a bad value, a key given twice.
 */
static int read_config(struct agent_config *c, const char *path)
{
	unsigned lineno = 0, seen[O_VERSION + 1] = { 0 };
	char *line = NULL;
	size_t cap = 0;
	struct stat st;
	ssize_t n;
	FILE *f = fopen(path, "r");
	int ret = 0;

	if (!f) {
		fprintf(stderr, "kvarena-agent: --config %s: %s\n", path, strerror(errno));
		return -EINVAL;
	}
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "kvarena-agent: --config %s: not a regular file\n", path);
		fclose(f);
		return -EINVAL;
	}
	while ((n = getline(&line, &cap, f)) >= 0) {
		char *key, *value, *eq;
		const struct option *o;

		lineno++;
		if (memchr(line, '\0', (size_t)n)) {
			fprintf(stderr, "kvarena-agent: %s:%u: a NUL byte: not a text file\n", path,
				lineno);
			ret = -EINVAL;
			break;
		}
		if (n > 1024) {
			fprintf(stderr, "kvarena-agent: %s:%u: line longer than 1024 bytes\n", path,
				lineno);
			ret = -EINVAL;
			break;
		}
		key = trim(line);
		if (!*key || *key == '#')
			continue;
		eq = strchr(key, '=');
		if (!eq) {
			fprintf(stderr, "kvarena-agent: %s:%u: expected \"key = value\"\n", path,
				lineno);
			ret = -EINVAL;
			break;
		}
		*eq = '\0';
		key = trim(key);
		value = trim(eq + 1);
		for (o = options; o->name; o++)
			if (!strcmp(o->name, key))
				break;
		if (!o->name || o->val == O_CONFIG || o->val == O_HELP || o->val == O_VERSION) {
			fprintf(stderr, "kvarena-agent: %s:%u: unknown key \"%s\"\n", path, lineno,
				key);
			ret = -EINVAL;
			break;
		}
		/* repeatable keys add to a list; any other is said once */
		if (o->val != O_ALLOW_UID && o->val != O_ALLOW_GID && o->val != O_TENANT_QUOTA &&
		    seen[o->val]) {
			fprintf(stderr, "kvarena-agent: %s:%u: \"%s\" given twice (first at line "
				"%u)\n", path, lineno, key, seen[o->val]);
			ret = -EINVAL;
			break;
		}
		seen[o->val] = lineno;
		if ((ret = set_option(c, o->val, key, value)) < 0) {
			fprintf(stderr, "kvarena-agent: (in %s, line %u)\n", path, lineno);
			break;
		}
	}
	free(line);
	fclose(f);
	return ret;
}

int agent_config_parse(int argc, char **argv, struct agent_config *c)
{
	int opt, ret;

	*c = (struct agent_config){
		.socket_mode = 0660,
		.socket_group = (gid_t)-1,
		.name = "kvarena",
		.backend = "host",
		.memory = 128ull << 20,
		.geometry = { .block_tokens = 16, .layers = 4, .kv_heads = 2, .head_dim = 64,
			      .dtype = KVA_F16, .layout = KVA_LAYOUT_BLOCK_MAJOR },
		.numa_node = -1,
		.max_workers = KVA_MAX_WORKERS,
		.log_level = LOG_INFO,
		.shutdown_grace_ms = 5000,
		.check_interval_ms = 1000,
		.tiers = { .host_node = -1, .host_hugepages = true, .queue_depth = 64 },
	};
	snprintf(c->socket, sizeof(c->socket), "%s", kva_default_socket());

	/* the config file first, wherever --config is on the line */
	for (int k = 1; k < argc; k++) {
		const char *file = NULL;

		if (!strcmp(argv[k], "--config") && k + 1 < argc)
			file = argv[k + 1];
		else if (!strncmp(argv[k], "--config=", 9))
			file = argv[k] + 9;
		if (file && (ret = read_config(c, file)) < 0)
			return ret;
	}
	opterr = 0;
	optind = 0; /* GNU getopt: 0 starts afresh (1 keeps state from an earlier argv) */
	while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
		const char *key = optind > 1 && optind <= argc ? argv[optind - 1] + 2 : "?";

		if (opt == O_HELP) {
			usage(stdout);
			return 1;
		}
		if (opt == O_VERSION) {
			printf("kvarena-agent %d.%d\n", KVA_VERSION_MAJOR, KVA_VERSION_MINOR);
			return 1;
		}
		if (opt == O_CONFIG)
			continue;
		if (opt == '?' || opt == ':') {
			fprintf(stderr, "kvarena-agent: %s: unknown flag or missing value "
				"(--help lists them)\n", argv[optind - 1]);
			return -EINVAL;
		}
		for (const struct option *o = options; o->name; o++)
			if (o->val == opt)
				key = o->name;
		if ((ret = set_option(c, opt, key, optarg)) < 0)
			return ret;
	}
	if (optind < argc) {
		fprintf(stderr, "kvarena-agent: unexpected argument \"%s\"\n", argv[optind]);
		return -EINVAL;
	}
	if (!c->n_allow_uid && !c->n_allow_gid)
		c->allow_uid[c->n_allow_uid++] = geteuid();
	if (c->tiers.disk_bytes && !c->tiers.disk_dir[0]) {
		fprintf(stderr, "kvarena-agent: --disk-bytes without --disk-dir: where?\n");
		return -EINVAL;
	}
	if (c->tiers.disk_dir[0] && !c->tiers.disk_bytes)
		c->tiers.disk_bytes = 1ull << 30;
	if (!c->host_node_set)
		c->tiers.host_node = c->numa_node;
	if (!agent_on_gpu(c) && (c->device[0] || c->memory_fraction || c->chunk_bytes ||
				 c->ipc != KVA_IPC_AUTO)) {
		fprintf(stderr, "kvarena-agent: --device, --memory-fraction, --chunk-bytes and --ipc "
			"are for --backend cuda\n");
		return -EINVAL;
	}
	if (agent_on_gpu(c) && c->hugepages) {
		fprintf(stderr, "kvarena-agent: --hugepages: the data of --backend cuda is device "
			"memory (--host-hugepages is the host tier's)\n");
		return -EINVAL;
	}
	if (agent_tiers_on(c) && c->max_workers < 2) {
		fprintf(stderr, "kvarena-agent: the tiers take one worker slot for the agent: "
			"--max-workers 2 at least\n");
		return -EINVAL;
	}
	agent_config_limits(c);
	if (c->max_slots_pid > c->max_workers || c->max_slots_uid > c->max_workers) {
		fprintf(stderr, "kvarena-agent: --max-slots-per-pid %u / --max-slots-per-uid %u: "
			"more than the %u worker slots\n", c->max_slots_pid, c->max_slots_uid,
			c->max_workers);
		return -EINVAL;
	}
	return 0;
}

/*
 * agent_config_limits - the defaults of the limits left unset: room for
 * others. One process may take a quarter of the slots (at least 2, for a
 * worker and a thread); one user all of them when the allow policy admits
 * one uid alone (nobody else could use them), three quarters otherwise.
 */
void agent_config_limits(struct agent_config *c)
{
	bool one_user = c->n_allow_uid == 1 && !c->n_allow_gid;

	if (!c->max_pending)
		c->max_pending = 256;
	if (!c->max_pending_uid)
		c->max_pending_uid = 16;
	if (!c->hello_timeout_ms)
		c->hello_timeout_ms = 2000;
	if (!c->max_slots_pid)
		c->max_slots_pid = c->max_workers / 4 < 2 ? (c->max_workers < 2 ? 1 : 2)
							  : c->max_workers / 4;
	if (!c->max_slots_uid)
		c->max_slots_uid = one_user ? c->max_workers
					    : (c->max_workers * 3 / 4 ? c->max_workers * 3 / 4 : 1);
}

/* agent_name_ok - @s is at most @max bytes of printable UTF-8 (text.h) */
bool agent_name_ok(const char *s, size_t max)
{
	return text_printable(s, max);
}
