/* SPDX-License-Identifier: MIT */
/*
 * proto.c - building and strictly decoding protocol messages.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "arena_pvt.h"
#include "proto_pvt.h"

static const size_t msg_size[] = {
	[KVA__MSG_HELLO] = sizeof(struct kva__hello),
	[KVA__MSG_WELCOME] = sizeof(struct kva__welcome),
	[KVA__MSG_REFUSE] = sizeof(struct kva__refuse),
	[KVA__MSG_SHUTDOWN] = sizeof(struct kva__shutdown),
	[KVA__MSG_BYE] = sizeof(struct kva__bye),
	[KVA__MSG_ADOPTED] = sizeof(struct kva__adopted),
	[KVA__MSG_DEVMEM] = sizeof(struct kva__devmem),
};

static const char *const type_name[] = {
	[KVA__MSG_HELLO] = "HELLO",       [KVA__MSG_WELCOME] = "WELCOME",
	[KVA__MSG_REFUSE] = "REFUSE",     [KVA__MSG_SHUTDOWN] = "SHUTDOWN",
	[KVA__MSG_BYE] = "BYE",             [KVA__MSG_ADOPTED] = "ADOPTED",
	[KVA__MSG_DEVMEM] = "DEVMEM",
};

const char *kva__msg_type_name(uint32_t type)
{
	return type && type <= KVA__MSG_DEVMEM ? type_name[type] : "unknown";
}

size_t kva__msg_init(union kva__msg *m, enum kva__msg_type type)
{
	memset(m, 0, sizeof(*m));
	m->h.length = (uint32_t)msg_size[type];
	m->h.version = KVA__PROTO_VERSION;
	m->h.type = (uint16_t)type;
	return msg_size[type];
}

void kva__msg_str(char *dst, size_t size, const char *src)
{
	size_t n = src ? strnlen(src, size - 1) : 0;

	memset(dst, 0, size);
	memcpy(dst, src ? src : "", n);
}

/* A string field: NUL-terminated, and nothing but zeros after the NUL, so
 * that two equal strings are equal bytes and no stale data travels. */
static bool str_ok(const char *s, size_t size)
{
	const char *nul = memchr(s, '\0', size);

	if (!nul)
		return false;
	for (const char *p = nul; p < s + size; p++)
		if (*p)
			return false;
	return true;
}

#define BAD(...) kva__err(-EPROTO, "protocol: " __VA_ARGS__)

int kva__msg_version(const void *buf, size_t len)
{
	struct kva__msg_hdr h;

	if (len < sizeof(h))
		return BAD("%zu bytes, shorter than a header", len);
	memcpy(&h, buf, sizeof(h));
	return h.version;
}

int kva__msg_decode(const void *buf, size_t len, int nfds, union kva__msg *out)
{
	struct kva__msg_hdr h;
	union kva__msg m;
	const char *what;

	if (len < sizeof(h))
		return BAD("%zu bytes, shorter than a header", len);
	memcpy(&h, buf, sizeof(h));
	if (h.length != len)
		return BAD("length field says %u bytes, the message has %zu", h.length, len);
	if (h.version != KVA__PROTO_VERSION)
		return BAD("version %u, this side speaks %u", h.version, KVA__PROTO_VERSION);
	if (h.type < KVA__MSG_HELLO || h.type > KVA__MSG_DEVMEM)
		return BAD("unknown message type %u", h.type);
	what = type_name[h.type];
	if (len != msg_size[h.type])
		return BAD("%s of %zu bytes, it has %zu%s", what, len, msg_size[h.type],
			   len > msg_size[h.type] ? " (trailing bytes)" : "");
	memcpy(&m, buf, len);
	/* a WELCOME brings the two regions (a GPU arena: the metadata alone),
	 * then the tiers' doorbell and host tier if it says so; a DEVMEM its
	 * chunks' fds */
	if (h.type == KVA__MSG_DEVMEM) {
		if (m.devmem.flags & KVA__DEVMEM_LEGACY ? nfds != 0 : (uint32_t)nfds != m.devmem.count)
			return BAD("DEVMEM of %u chunks with %d file descriptors", m.devmem.count,
				   nfds);
	} else if (nfds != (h.type != KVA__MSG_WELCOME ? 0
			    : 2 - !!(m.welcome.flags & KVA__WELCOME_DEVICE) +
				      !!(m.welcome.flags & KVA__WELCOME_DOORBELL) +
				      !!(m.welcome.flags & KVA__WELCOME_HOSTTIER))) {
		return BAD("%s with %d file descriptors", what, nfds);
	}

	switch (h.type) {
	case KVA__MSG_HELLO:
		if (m.hello.pid <= 0)
			return BAD("HELLO with pid %d", m.hello.pid);
		if (m.hello.flags & ~KVA__HELLO_OBSERVER)
			return BAD("HELLO with unknown flags %#x", m.hello.flags);
		if (!str_ok(m.hello.name, sizeof(m.hello.name)))
			return BAD("HELLO name not a terminated, zero-padded string");
		break;
	case KVA__MSG_WELCOME:
		if (m.welcome.flags & ~(KVA__WELCOME_READONLY | KVA__WELCOME_DOORBELL |
					KVA__WELCOME_HOSTTIER | KVA__WELCOME_DEVICE))
			return BAD("WELCOME with unknown flags %#x", m.welcome.flags);
		if ((m.welcome.flags & KVA__WELCOME_HOSTTIER) &&
		    !(m.welcome.flags & KVA__WELCOME_DOORBELL))
			return BAD("WELCOME with a host tier and no doorbell");
		if (m.welcome.slot == KVA__NO_SLOT
			    ? !(m.welcome.flags & KVA__WELCOME_READONLY)
			    : m.welcome.slot >= KVA_MAX_WORKERS)
			return BAD("WELCOME with slot %u", m.welcome.slot);
		if (m.welcome.agent_pid <= 0 || !m.welcome.meta_bytes || !m.welcome.data_bytes)
			return BAD("WELCOME with pid %d and sizes %llu/%llu", m.welcome.agent_pid,
				   (unsigned long long)m.welcome.meta_bytes,
				   (unsigned long long)m.welcome.data_bytes);
		if (!str_ok(m.welcome.arena, sizeof(m.welcome.arena)))
			return BAD("WELCOME arena name not a terminated, zero-padded string");
		break;
	case KVA__MSG_REFUSE:
		if (!m.refuse.reason || m.refuse.reason > KVA__REFUSE_MAX || m.refuse.reserved)
			return BAD("REFUSE with reason %u", m.refuse.reason);
		if (!str_ok(m.refuse.text, sizeof(m.refuse.text)))
			return BAD("REFUSE text not a terminated, zero-padded string");
		break;
	case KVA__MSG_DEVMEM:
		if (m.devmem.flags & ~KVA__DEVMEM_LEGACY || m.devmem.reserved)
			return BAD("DEVMEM with flags %#x", m.devmem.flags);
		if (m.devmem.flags & KVA__DEVMEM_LEGACY) {
			if (m.devmem.first || m.devmem.count != 1)
				return BAD("DEVMEM legacy handle as chunks %u..+%u", m.devmem.first,
					   m.devmem.count);
			break;
		}
		if (!m.devmem.count || m.devmem.count > KVA__SCM_MAX_FD ||
		    m.devmem.first >= KVA_MAX_CHUNKS ||
		    m.devmem.count > KVA_MAX_CHUNKS - m.devmem.first)
			return BAD("DEVMEM of chunks %u..+%u", m.devmem.first, m.devmem.count);
		for (size_t k = 0; k < sizeof(m.devmem.ipc_handle); k++)
			if (m.devmem.ipc_handle[k])
				return BAD("DEVMEM of fds with an IPC handle");
		break;
	case KVA__MSG_SHUTDOWN:
		if (m.shutdown.grace_ms > KVA__SHUTDOWN_MAX_MS || m.shutdown.reserved)
			return BAD("SHUTDOWN with grace %u ms", m.shutdown.grace_ms);
		break;
	default: /* BYE, ADOPTED: a header alone */
		break;
	}
	*out = m;
	return 0;
}

static const struct {
	int err;
	const char *name;
} refusals[] = {
	[KVA__REFUSE_NOT_ALLOWED] = { -EACCES, "not allowed" },
	[KVA__REFUSE_FULL] = { -EUSERS, "no free worker slot" },
	[KVA__REFUSE_VERSION] = { -EPROTONOSUPPORT, "protocol version mismatch" },
	[KVA__REFUSE_PROTOCOL] = { -EPROTO, "malformed HELLO" },
	[KVA__REFUSE_PID_MISMATCH] = { -EPERM, "pid does not match the credentials" },
	[KVA__REFUSE_STOPPING] = { -ESHUTDOWN, "agent shutting down" },
	[KVA__REFUSE_INTERNAL] = { -EIO, "agent error" },
	[KVA__REFUSE_LIMIT] = { -EDQUOT, "over a limit of the agent" },
};

int kva__refusal_errno(uint32_t reason)
{
	return reason && reason <= KVA__REFUSE_MAX ? refusals[reason].err : -EPROTO;
}

const char *kva__refusal_name(uint32_t reason)
{
	return reason && reason <= KVA__REFUSE_MAX ? refusals[reason].name : "unknown";
}
