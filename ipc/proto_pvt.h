/* SPDX-License-Identifier: MIT */
/*
 * proto_pvt.h - the agent <-> worker protocol: fixed-layout messages on a
 * Unix SOCK_SEQPACKET socket (one message per packet, so lengths are exact),
 * region fds passed with SCM_RIGHTS. Both ends are on one machine, so fields
 * are in its byte order.
 *
 *   worker/observer                      agent
 *   HELLO (pid, flags, name)     ---->   SO_PEERCRED against the allow policy,
 *                                        the pid must be the peer's,
 *                                        a slot reserved (workers only)
 *                                <----   WELCOME (slot, generation, sizes)
 *                                        + metadata and data fds (and, with
 *                                        tiers, the eventfd a worker writes
 *                                        to wake the agent's tier thread, and
 *                                        the host tier's memory, read-only)
 *                                <----   a GPU arena (WELCOME_DEVICE): no
 *                                        data fd; to a worker, DEVMEM
 *                                        messages follow, in order, with the
 *                                        chunks' fds (at most SCM_MAX_FD a
 *                                        message), or the legacy IPC handle
 *                                <----   or REFUSE (reason, text); then close
 *   ADOPTED                      ---->   the slot is adopted (LIVE): what the
 *                                        agent restores if a worker overwrites it
 *   ... shared memory only ...
 *                                <----   SHUTDOWN (grace) when stopping
 *   BYE                          ---->   (or EOF) when leaving
 *
 * Every message starts with struct kva__msg_hdr. The decoder is strict: a
 * message is exactly its type's size, strings are NUL-terminated and
 * zero-padded, reserved fields and unknown flags are zero. Anything else is
 * -EPROTO, with the reason in kva_errmsg().
 */
#ifndef KVA_PROTO_PVT_H
#define KVA_PROTO_PVT_H

#include <stddef.h>
#include <stdint.h>

#define KVA__PROTO_VERSION 2u
#define KVA__NAME_LEN 32
#define KVA__TEXT_LEN 128
#define KVA__NO_SLOT 0xffffffffu       /* WELCOME of an observer */
#define KVA__SHUTDOWN_MAX_MS 3600000u

struct kva__msg_hdr {
	uint32_t length;   /* of the whole message, this header included */
	uint16_t version;  /* KVA__PROTO_VERSION */
	uint16_t type;     /* enum kva__msg_type */
};

enum kva__msg_type {
	KVA__MSG_HELLO = 1,
	KVA__MSG_WELCOME = 2,
	KVA__MSG_REFUSE = 3,
	KVA__MSG_SHUTDOWN = 4,
	KVA__MSG_BYE = 5,
	KVA__MSG_ADOPTED = 6,
	KVA__MSG_DEVMEM = 7,
};

#define KVA__HELLO_OBSERVER 0x1u  /* read-only mapping, no slot */

struct kva__hello {
	struct kva__msg_hdr h;
	int32_t pid;               /* must equal the peer's SO_PEERCRED pid */
	uint32_t flags;            /* KVA__HELLO_* */
	char name[KVA__NAME_LEN];
};

#define KVA__WELCOME_READONLY 0x1u /* the fds are read-only */
#define KVA__WELCOME_DOORBELL 0x2u /* a third fd: the tiers' doorbell (an eventfd) */
#define KVA__WELCOME_HOSTTIER 0x4u /* and a fourth: the host tier, read-only */
#define KVA__WELCOME_DEVICE 0x8u   /* the data is on a GPU: no data fd (DEVMEM follows) */

struct kva__welcome {
	struct kva__msg_hdr h;
	uint32_t slot;             /* reserved for the peer's pid; KVA__NO_SLOT for an observer */
	uint32_t generation;
	int32_t agent_pid;
	uint32_t flags;            /* KVA__WELCOME_* */
	uint64_t meta_bytes;       /* sizes of the two regions that come as fds */
	uint64_t data_bytes;
	char arena[KVA__NAME_LEN];
};

enum kva__refusal {
	KVA__REFUSE_NOT_ALLOWED = 1,  /* uid/gid outside the allow policy */
	KVA__REFUSE_FULL = 2,         /* no free worker slot */
	KVA__REFUSE_VERSION = 3,      /* another protocol version */
	KVA__REFUSE_PROTOCOL = 4,     /* a malformed HELLO */
	KVA__REFUSE_PID_MISMATCH = 5, /* HELLO's pid is not the peer's */
	KVA__REFUSE_STOPPING = 6,     /* the agent is shutting down */
	KVA__REFUSE_INTERNAL = 7,     /* the agent failed (fds, memory) */
	KVA__REFUSE_LIMIT = 8,        /* a limit per process, per user, or on connections */
	KVA__REFUSE_MAX = 8,
};

struct kva__refuse {
	struct kva__msg_hdr h;
	uint32_t reason;           /* enum kva__refusal */
	uint32_t reserved;
	char text[KVA__TEXT_LEN];  /* for the peer's kva_errmsg() */
};

struct kva__shutdown {
	struct kva__msg_hdr h;
	uint32_t grace_ms;         /* how long the agent waits for workers to leave */
	uint32_t reserved;
};

struct kva__bye {
	struct kva__msg_hdr h;
};

/*
 * The kernel's SCM_MAX_FD (include/net/scm.h, not in the uapi headers): a
 * sendmsg with more fds fails with EINVAL (scm_fp_copy). A GPU arena's
 * chunks come in messages of at most this many.
 */
#define KVA__SCM_MAX_FD 253
#define KVA__DEVMEM_LEGACY 0x1u /* the IPC handle, and no fds */

/* chunks [first, first + count) of a GPU arena: their fds, in order */
struct kva__devmem {
	struct kva__msg_hdr h;
	uint32_t first;
	uint32_t count;            /* fds with the message; 1 for the legacy handle */
	uint32_t flags;            /* KVA__DEVMEM_* */
	uint32_t reserved;
	uint8_t ipc_handle[64];    /* legacy: the cuIpcMemHandle; else zero */
};

struct kva__adopted {
	struct kva__msg_hdr h;
};

union kva__msg {
	struct kva__msg_hdr h;
	struct kva__hello hello;
	struct kva__welcome welcome;
	struct kva__refuse refuse;
	struct kva__shutdown shutdown;
	struct kva__bye bye;
	struct kva__adopted adopted;
	struct kva__devmem devmem;
};

/* proto.c */

/*
 * kva__msg_init - zero @m and fill its header for @type; returns the size to
 * send. Strings are copied with kva__msg_str() so they stay zero-padded.
 */
size_t kva__msg_init(union kva__msg *m, enum kva__msg_type type);
void kva__msg_str(char *dst, size_t size, const char *src);

/*
 * kva__msg_decode - check @len bytes at @buf, received with @nfds fds, and copy
 * them to @out. Return: 0, or -EPROTO (the reason in kva_errmsg()).
 */
int kva__msg_decode(const void *buf, size_t len, int nfds, union kva__msg *out);

/* kva__msg_version - the version field, if @len covers a header; else -EPROTO. */
int kva__msg_version(const void *buf, size_t len);

/* a refusal as an errno for the library's caller: -EACCES, -EUSERS, ... */
int kva__refusal_errno(uint32_t reason);
const char *kva__refusal_name(uint32_t reason);
const char *kva__msg_type_name(uint32_t type);

/* sock.c */
#define KVA__MAX_FDS 4 /* with any message but DEVMEM */

/* kva__sock_send - one message with @nfds (0..KVA__SCM_MAX_FD) fds */
int kva__sock_send(int fd, const union kva__msg *m, const int *fds, int nfds);
/*
 * kva__sock_recv - receive one message within @timeout_ms (-1: wait), with up
 * to KVA__MAX_FDS fds (close-on-exec). Returns its length; -ECONNRESET at end
 * of stream; -ETIMEDOUT; -EPROTO if it was longer than @cap or carried more
 * fds (those are closed). kva__sock_recv_fds takes up to @max_fds
 * (KVA__SCM_MAX_FD at most).
 */
int kva__sock_recv(int fd, void *buf, size_t cap, int *fds, int *nfds, int timeout_ms);
int kva__sock_recv_fds(int fd, void *buf, size_t cap, int *fds, int max_fds, int *nfds,
		       int timeout_ms);
int kva__sock_connect(const char *path, int *fd);

#endif /* KVA_PROTO_PVT_H */
