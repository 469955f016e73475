/* SPDX-License-Identifier: MIT */
/*
 * test_proto.c - the protocol decoder refuses every malformed message with
 * -EPROTO and a reason, accepts every well-formed one, and the socket layer
 * carries exact messages and fds (and refuses too-long ones, dropping their
 * fds) over a real SOCK_SEQPACKET socketpair.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena_pvt.h"
#include "proto_pvt.h"
#include "testutil.h"

static union kva__msg good(enum kva__msg_type t)
{
	union kva__msg m;

	kva__msg_init(&m, t);
	switch (t) {
	case KVA__MSG_HELLO:
		m.hello.pid = 1234;
		kva__msg_str(m.hello.name, sizeof(m.hello.name), "engine-0");
		break;
	case KVA__MSG_WELCOME:
		m.welcome.slot = 3;
		m.welcome.generation = 7;
		m.welcome.agent_pid = 99;
		m.welcome.meta_bytes = 4096;
		m.welcome.data_bytes = 1 << 20;
		kva__msg_str(m.welcome.arena, sizeof(m.welcome.arena), "gpu0");
		break;
	case KVA__MSG_REFUSE:
		m.refuse.reason = KVA__REFUSE_FULL;
		kva__msg_str(m.refuse.text, sizeof(m.refuse.text), "no slot");
		break;
	case KVA__MSG_SHUTDOWN:
		m.shutdown.grace_ms = 5000;
		break;
	case KVA__MSG_BYE:
	case KVA__MSG_ADOPTED:
		break;
	case KVA__MSG_DEVMEM:
		m.devmem.first = 253;
		m.devmem.count = 2;
		break;
	}
	return m;
}

static int fds_for(enum kva__msg_type t)
{
	return t == KVA__MSG_WELCOME || t == KVA__MSG_DEVMEM ? 2 : 0;
}

/* decode @m as sent (its length field), expecting -EPROTO mentioning @why */
static void refused(const union kva__msg *m, size_t len, int nfds, const char *why)
{
	union kva__msg out;
	int ret = kva__msg_decode(m, len, nfds, &out);

	if (ret != -EPROTO || !strstr(kva_errmsg(), why))
		fail_msg("expected -EPROTO \"%s\", got %d \"%s\"", why, ret, kva_errmsg());
}

static void test_every_well_formed_message_decodes_to_itself(void **state)
{
	(void)state;
	for (int t = KVA__MSG_HELLO; t <= KVA__MSG_DEVMEM; t++) {
		union kva__msg m = good((enum kva__msg_type)t), out;

		assert_int_equal(kva__msg_decode(&m, m.h.length, fds_for(t), &out), 0);
		assert_memory_equal(&m, &out, m.h.length);
	}
	{
		union kva__msg m = good(KVA__MSG_WELCOME), out;

		m.welcome.slot = KVA__NO_SLOT;
		m.welcome.flags = KVA__WELCOME_READONLY;
		assert_int_equal(kva__msg_decode(&m, m.h.length, 2, &out), 0);
		m.welcome.slot = KVA_MAX_WORKERS - 1;
		m.welcome.flags = 0;
		assert_int_equal(kva__msg_decode(&m, m.h.length, 2, &out), 0);
		/* with the tiers' doorbell: three fds, and only with the flag */
		assert_int_equal(kva__msg_decode(&m, m.h.length, 3, &out), -EPROTO);
		m.welcome.flags = KVA__WELCOME_DOORBELL;
		assert_int_equal(kva__msg_decode(&m, m.h.length, 3, &out), 0);
		assert_int_equal(kva__msg_decode(&m, m.h.length, 2, &out), -EPROTO);
		/* a GPU arena: the metadata alone (its data comes as DEVMEM) */
		m.welcome.flags = KVA__WELCOME_DEVICE;
		assert_int_equal(kva__msg_decode(&m, m.h.length, 1, &out), 0);
		assert_int_equal(kva__msg_decode(&m, m.h.length, 2, &out), -EPROTO);
		m.welcome.flags = KVA__WELCOME_DEVICE | KVA__WELCOME_DOORBELL;
		assert_int_equal(kva__msg_decode(&m, m.h.length, 2, &out), 0);
	}
	{
		/* the legacy IPC handle: one chunk, no fds */
		union kva__msg m = good(KVA__MSG_DEVMEM), out;

		m.devmem.first = 0;
		m.devmem.count = 1;
		m.devmem.flags = KVA__DEVMEM_LEGACY;
		memset(m.devmem.ipc_handle, 0xa5, sizeof(m.devmem.ipc_handle));
		assert_int_equal(kva__msg_decode(&m, m.h.length, 0, &out), 0);
		assert_memory_equal(out.devmem.ipc_handle, m.devmem.ipc_handle, 64);
		/* and a full message of fds */
		m = good(KVA__MSG_DEVMEM);
		m.devmem.count = KVA__SCM_MAX_FD;
		assert_int_equal(kva__msg_decode(&m, m.h.length, KVA__SCM_MAX_FD, &out), 0);
	}
}

static void test_short_and_mislabelled_lengths_are_eproto(void **state)
{
	union kva__msg m = good(KVA__MSG_HELLO);
	char big[sizeof(m) + 8] = { 0 };

	(void)state;
	for (size_t len = 0; len < sizeof(struct kva__msg_hdr); len++)
		refused(&m, len, 0, "shorter than a header");
	m.h.length += 1;
	refused(&m, m.h.length - 1, 0, "length field");
	m.h.length -= 2;
	refused(&m, m.h.length + 1, 0, "length field");
	m = good(KVA__MSG_HELLO);
	/* each type one byte short, and one byte long (the length field agreeing) */
	for (int t = KVA__MSG_HELLO; t <= KVA__MSG_DEVMEM; t++) {
		union kva__msg g = good((enum kva__msg_type)t);
		size_t size = g.h.length;

		memcpy(big, &g, size);
		((struct kva__msg_hdr *)big)->length = (uint32_t)(size + 1);
		refused((union kva__msg *)big, size + 1, fds_for(t), "trailing bytes");
		((struct kva__msg_hdr *)big)->length = (uint32_t)(size - 1);
		if (size - 1 >= sizeof(struct kva__msg_hdr))
			refused((union kva__msg *)big, size - 1, fds_for(t), "bytes, it has");
	}
}

static void test_version_and_type_are_checked(void **state)
{
	static const uint16_t types[] = { 0, 8, 77, 0xffff };
	union kva__msg m = good(KVA__MSG_BYE);

	(void)state;
	m.h.version = 1; /* before GPU arenas: its peers cannot take a DEVMEM */
	refused(&m, m.h.length, 0, "version 1");
	assert_int_equal(kva__msg_version(&m, m.h.length), 1);
	m.h.version = 3;
	refused(&m, m.h.length, 0, "version 3");
	assert_int_equal(kva__msg_version(&m, 3), -EPROTO);
	m.h.version = 0;
	refused(&m, m.h.length, 0, "version 0");
	m = good(KVA__MSG_BYE);
	for (unsigned k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
		m.h.type = types[k];
		refused(&m, m.h.length, 0, "unknown message type");
	}
}

static void test_wrong_fd_counts_are_eproto(void **state)
{
	union kva__msg w = good(KVA__MSG_WELCOME), h = good(KVA__MSG_HELLO);

	(void)state;
	refused(&w, w.h.length, 0, "file descriptors");
	refused(&w, w.h.length, 1, "file descriptors");
	refused(&w, w.h.length, 3, "file descriptors");
	refused(&h, h.h.length, 1, "file descriptors");
	refused(&h, h.h.length, 2, "file descriptors");
}

static void test_bad_fields_are_eproto(void **state)
{
	union kva__msg m;

	(void)state;
	m = good(KVA__MSG_HELLO);
	m.hello.pid = 0;
	refused(&m, m.h.length, 0, "pid 0");
	m.hello.pid = -5;
	refused(&m, m.h.length, 0, "pid -5");
	m = good(KVA__MSG_HELLO);
	m.hello.flags = 0x2;
	refused(&m, m.h.length, 0, "unknown flags");
	m = good(KVA__MSG_HELLO);
	memset(m.hello.name, 'x', sizeof(m.hello.name));
	refused(&m, m.h.length, 0, "name");
	m = good(KVA__MSG_HELLO);
	m.hello.name[20] = 'z'; /* garbage after the terminating NUL */
	refused(&m, m.h.length, 0, "zero-padded");

	m = good(KVA__MSG_WELCOME);
	m.welcome.slot = KVA_MAX_WORKERS;
	refused(&m, m.h.length, 2, "slot");
	m.welcome.slot = KVA__NO_SLOT; /* a slotless WELCOME must be read-only */
	refused(&m, m.h.length, 2, "slot");
	m = good(KVA__MSG_WELCOME);
	m.welcome.flags = 0x10;
	refused(&m, m.h.length, 2, "unknown flags");
	m = good(KVA__MSG_WELCOME);
	m.welcome.agent_pid = 0;
	refused(&m, m.h.length, 2, "pid 0");
	m = good(KVA__MSG_WELCOME);
	m.welcome.meta_bytes = 0;
	refused(&m, m.h.length, 2, "sizes");
	m = good(KVA__MSG_WELCOME);
	memset(m.welcome.arena, 'a', sizeof(m.welcome.arena));
	refused(&m, m.h.length, 2, "arena name");

	m = good(KVA__MSG_REFUSE);
	m.refuse.reason = 0;
	refused(&m, m.h.length, 0, "reason 0");
	m.refuse.reason = KVA__REFUSE_MAX + 1;
	refused(&m, m.h.length, 0, "reason");
	m = good(KVA__MSG_REFUSE);
	m.refuse.reserved = 1;
	refused(&m, m.h.length, 0, "reason");
	m = good(KVA__MSG_REFUSE);
	memset(m.refuse.text, 't', sizeof(m.refuse.text));
	refused(&m, m.h.length, 0, "text");

	/* DEVMEM: fds as counted, within one message's limit and the chunks */
	m = good(KVA__MSG_DEVMEM);
	refused(&m, m.h.length, 1, "DEVMEM of 2 chunks with 1 file descriptors");
	refused(&m, m.h.length, 3, "file descriptors");
	m.devmem.count = 0;
	refused(&m, m.h.length, 0, "DEVMEM of chunks");
	m.devmem.count = KVA__SCM_MAX_FD + 1;
	refused(&m, m.h.length, KVA__SCM_MAX_FD + 1, "DEVMEM of chunks");
	m = good(KVA__MSG_DEVMEM);
	m.devmem.first = KVA_MAX_CHUNKS - 1;
	refused(&m, m.h.length, 2, "DEVMEM of chunks");
	m = good(KVA__MSG_DEVMEM);
	m.devmem.ipc_handle[63] = 1;
	refused(&m, m.h.length, 2, "an IPC handle");
	m = good(KVA__MSG_DEVMEM);
	m.devmem.flags = 0x2;
	refused(&m, m.h.length, 2, "flags");
	m = good(KVA__MSG_DEVMEM);
	m.devmem.reserved = 1;
	refused(&m, m.h.length, 2, "flags");
	m = good(KVA__MSG_DEVMEM);
	m.devmem.flags = KVA__DEVMEM_LEGACY;
	refused(&m, m.h.length, 2, "DEVMEM of 2 chunks with 2 file descriptors");
	m.devmem.first = 0;
	refused(&m, m.h.length, 0, "legacy handle as chunks");
	m.devmem.count = 1;
	m.devmem.first = 1;
	refused(&m, m.h.length, 0, "legacy handle as chunks");

	m = good(KVA__MSG_SHUTDOWN);
	m.shutdown.grace_ms = KVA__SHUTDOWN_MAX_MS + 1;
	refused(&m, m.h.length, 0, "grace");
	m = good(KVA__MSG_SHUTDOWN);
	m.shutdown.reserved = 3;
	refused(&m, m.h.length, 0, "grace");
}

static void test_refusals_become_clear_errnos(void **state)
{
	(void)state;
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_NOT_ALLOWED), -EACCES);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_FULL), -EUSERS);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_VERSION), -EPROTONOSUPPORT);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_PROTOCOL), -EPROTO);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_PID_MISMATCH), -EPERM);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_STOPPING), -ESHUTDOWN);
	assert_int_equal(kva__refusal_errno(KVA__REFUSE_INTERNAL), -EIO);
	assert_int_equal(kva__refusal_errno(0), -EPROTO);
	assert_int_equal(kva__refusal_errno(99), -EPROTO);
	assert_string_equal(kva__msg_type_name(42), "unknown");
}

static void test_strings_are_truncated_and_padded(void **state)
{
	union kva__msg m, out;
	char longname[100];

	(void)state;
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = 1;
	kva__msg_str(m.hello.name, sizeof(m.hello.name), longname);
	assert_int_equal(strlen(m.hello.name), KVA__NAME_LEN - 1);
	assert_int_equal(kva__msg_decode(&m, m.h.length, 0, &out), 0);
	kva__msg_str(m.hello.name, sizeof(m.hello.name), NULL);
	assert_int_equal(kva__msg_decode(&m, m.h.length, 0, &out), 0);
}

/* ----------------------------------------------------------- the socket */

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_messages_and_fds_cross_a_socket(void **state)
{
	union kva__msg m = good(KVA__MSG_WELCOME), out;
	char buf[sizeof(union kva__msg)];
	int sv[2], fds[KVA__MAX_FDS], got[KVA__MAX_FDS], nfds, n;
	struct stat a, b;

	(void)state;
	pair(sv);
	fds[0] = memfd_create("a", MFD_CLOEXEC);
	fds[1] = memfd_create("b", MFD_CLOEXEC);
	assert_int_equal(kva__sock_send(sv[0], &m, fds, 2), 0);
	n = kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 1000);
	assert_int_equal(n, sizeof(struct kva__welcome));
	assert_int_equal(nfds, 2);
	assert_int_equal(kva__msg_decode(buf, (size_t)n, nfds, &out), 0);
	/* the same files, new descriptors, close-on-exec */
	assert_int_equal(fstat(fds[0], &a), 0);
	assert_int_equal(fstat(got[0], &b), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_true(fcntl(got[1], F_GETFD) & FD_CLOEXEC);
	for (int k = 0; k < 2; k++) {
		close(fds[k]);
		close(got[k]);
	}
	close(sv[0]);
	close(sv[1]);
}

static void test_socket_refuses_long_messages_and_extra_fds(void **state)
{
	char big[sizeof(union kva__msg) + 100], buf[sizeof(union kva__msg)];
	union kva__msg m = good(KVA__MSG_BYE);
	int sv[2], fds[KVA__MAX_FDS + 1], got[KVA__MAX_FDS], nfds;
	struct msghdr msg = { 0 };
	struct iovec iov;
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int) * (KVA__MAX_FDS + 1))];
	} ctl;
	struct cmsghdr *c;

	(void)state;
	pair(sv);
	memset(big, 1, sizeof(big));
	assert_int_equal(send(sv[0], big, sizeof(big), 0), (ssize_t)sizeof(big));
	assert_int_equal(kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 1000), -EPROTO);
	assert_non_null(strstr(kva_errmsg(), "longer"));

	/* one fd more than is ever sent: all closed, -EPROTO */
	for (int k = 0; k < KVA__MAX_FDS + 1; k++)
		fds[k] = memfd_create("x", MFD_CLOEXEC);
	iov = (struct iovec){ &m, m.h.length };
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.b;
	msg.msg_controllen = sizeof(ctl.b);
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	assert_int_equal(sendmsg(sv[0], &msg, 0), (ssize_t)m.h.length);
	assert_int_equal(kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 1000), -EPROTO);
	assert_int_equal(nfds, 0);
	for (int k = 0; k < KVA__MAX_FDS + 1; k++)
		close(fds[k]);
	close(sv[0]);
	close(sv[1]);
}

/*
 * A GPU arena's chunks: a message of SCM_MAX_FD fds crosses whole; one more
 * fd is more than the kernel carries in one message (so the agent sends
 * several), and than kva__sock_send takes.
 */
static void test_a_message_carries_scm_max_fd_fds_and_no_more(void **state)
{
	union kva__msg m = good(KVA__MSG_DEVMEM), out;
	char buf[sizeof(union kva__msg)];
	int sv[2], fds[KVA__SCM_MAX_FD + 1], got[KVA__SCM_MAX_FD], nfds, n;
	struct msghdr msg = { 0 };
	struct iovec iov;
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int) * (KVA__SCM_MAX_FD + 1))];
	} ctl;
	struct cmsghdr *c;
	struct stat a, b;

	(void)state;
	pair(sv);
	for (int k = 0; k < KVA__SCM_MAX_FD + 1; k++)
		assert_true((fds[k] = memfd_create("chunk", MFD_CLOEXEC)) >= 0);
	m.devmem.count = KVA__SCM_MAX_FD;
	assert_int_equal(kva__sock_send(sv[0], &m, fds, KVA__SCM_MAX_FD), 0);
	n = kva__sock_recv_fds(sv[1], buf, sizeof(buf), got, KVA__SCM_MAX_FD, &nfds, 1000);
	assert_int_equal(n, sizeof(struct kva__devmem));
	assert_int_equal(nfds, KVA__SCM_MAX_FD);
	assert_int_equal(kva__msg_decode(buf, (size_t)n, nfds, &out), 0);
	assert_int_equal(fstat(fds[KVA__SCM_MAX_FD - 1], &a), 0);
	assert_int_equal(fstat(got[KVA__SCM_MAX_FD - 1], &b), 0);
	assert_int_equal(a.st_ino, b.st_ino);
	for (int k = 0; k < nfds; k++)
		close(got[k]);
	/* the same message taken by the plain receive: too many fds, all closed */
	assert_int_equal(kva__sock_send(sv[0], &m, fds, KVA__SCM_MAX_FD), 0);
	assert_int_equal(kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 1000), -EPROTO);
	assert_int_equal(nfds, 0);
	/* one more: the kernel refuses it (scm_fp_copy), and so do we */
	assert_int_equal(kva__sock_send(sv[0], &m, fds, KVA__SCM_MAX_FD + 1), -EINVAL);
	iov = (struct iovec){ &m, m.h.length };
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.b;
	msg.msg_controllen = sizeof(ctl.b);
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	assert_int_equal(sendmsg(sv[0], &msg, 0), -1);
	assert_int_equal(errno, EINVAL);
	for (int k = 0; k < KVA__SCM_MAX_FD + 1; k++)
		close(fds[k]);
	close(sv[0]);
	close(sv[1]);
}

static void test_socket_end_and_silence(void **state)
{
	char buf[sizeof(union kva__msg)];
	int sv[2], got[2], nfds;

	(void)state;
	pair(sv);
	assert_int_equal(kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 10), -ETIMEDOUT);
	close(sv[0]);
	assert_int_equal(kva__sock_recv(sv[1], buf, sizeof(buf), got, &nfds, 1000), -ECONNRESET);
	close(sv[1]);
	assert_int_equal(kva__sock_connect("/nonexistent/kvarena.sock", &sv[0]), -ENOENT);
	assert_non_null(strstr(kva_errmsg(), "no kvarena agent"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_well_formed_message_decodes_to_itself),
		cmocka_unit_test(test_short_and_mislabelled_lengths_are_eproto),
		cmocka_unit_test(test_version_and_type_are_checked),
		cmocka_unit_test(test_wrong_fd_counts_are_eproto),
		cmocka_unit_test(test_bad_fields_are_eproto),
		cmocka_unit_test(test_refusals_become_clear_errnos),
		cmocka_unit_test(test_strings_are_truncated_and_padded),
		cmocka_unit_test(test_messages_and_fds_cross_a_socket),
		cmocka_unit_test(test_socket_refuses_long_messages_and_extra_fds),
		cmocka_unit_test(test_a_message_carries_scm_max_fd_fds_and_no_more),
		cmocka_unit_test(test_socket_end_and_silence),
	};

	return cmocka_run_group_tests_name("ipc_proto", tests, NULL, NULL);
}
