/* SPDX-License-Identifier: MIT */
/*
 * test_header.c - kva_arena_open() against corrupt and foreign regions: every
 * header byte flipped, every field wrong with a valid checksum, wrong files,
 * wrong sizes, missing seals. Each gives a clear error; none crashes.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena_pvt.h"
#include "testutil.h"

struct fixture {
	struct kva_arena *a;
	struct kva__header good;
	int meta_fd, data_fd;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	f->a = tu_arena(300, 0, 4);
	assert_non_null(f->a);
	f->meta_fd = kva_arena_meta_fd(f->a);
	f->data_fd = kva_arena_data_fd(f->a);
	assert_int_equal(pread(f->meta_fd, &f->good, sizeof(f->good), 0), sizeof(f->good));
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	kva_arena_close(f->a);
	free(f);
	return 0;
}

static void put_header(struct fixture *f, const struct kva__header *h)
{
	assert_int_equal(pwrite(f->meta_fd, h, sizeof(*h), 0), sizeof(*h));
}

static int try_open(struct fixture *f)
{
	struct kva_arena *b = NULL;
	int ret = kva_arena_open(f->meta_fd, f->data_fd, &b);

	if (ret == 0)
		kva_arena_close(b);
	else
		assert_null(b);
	return ret;
}

static void test_every_flipped_header_bit_is_refused(void **state)
{
	struct fixture *f = *state;
	uint8_t bytes[sizeof(struct kva__header)];

	for (size_t off = 0; off < sizeof(bytes); off++) {
		for (int bit = 0; bit < 8; bit += 3) {
			int ret;

			memcpy(bytes, &f->good, sizeof(bytes));
			bytes[off] ^= (uint8_t)(1u << bit);
			assert_int_equal(pwrite(f->meta_fd, bytes, sizeof(bytes), 0), sizeof(bytes));
			ret = try_open(f);
			if (ret != -EBADMSG && ret != -EPROTONOSUPPORT)
				fail_msg("byte %zu bit %d: open returned %d", off, bit, ret);
			assert_true(strlen(kva_errmsg()) > 0);
		}
	}
	put_header(f, &f->good);
	assert_int_equal(try_open(f), 0);
}

/* A field set wrong and the checksum made to match: what only the field
 * checks can catch. */
static void test_each_field_is_checked_even_with_a_valid_checksum(void **state)
{
	struct fixture *f = *state;
	struct {
		const char *field;
		size_t off, size;
		int64_t value;
		int err;
		const char *says;
	} cases[] = {
#define F(name, v, e, s) { #name, offsetof(struct kva__header, name), \
			   sizeof(((struct kva__header *)0)->name), v, e, s }
		F(magic, 0x1234, -EBADMSG, "magic"),
		F(abi_version, KVA__ABI_VERSION + 1, -EPROTONOSUPPORT, "ABI"),
		F(header_bytes, 8, -EBADMSG, "header_bytes"),
		F(block_tokens, 0, -EBADMSG, "block_tokens"),
		F(block_tokens, 17, -EBADMSG, "block_bytes"),
		F(layers, 0, -EBADMSG, "layers"),
		F(kv_heads, 5000, -EBADMSG, "kv_heads"),
		F(head_dim, 0, -EBADMSG, "head_dim"),
		F(head_dim, 65, -EBADMSG, "block_bytes"),
		F(dtype, 77, -EBADMSG, "dtype"),
		F(dtype, KVA_F32, -EBADMSG, "block_bytes"),
		F(layout, 5, -EBADMSG, "layout"),
		F(blocks, 0, -EBADMSG, "blocks"),
		F(blocks, 301, -EBADMSG, "data_bytes"),
		F(max_workers, 0, -EBADMSG, "max_workers"),
		F(max_workers, 49, -EBADMSG, "max_workers"),
		F(max_workers, 5, -EBADMSG, "offsets"),
		F(cache_blocks, 1 << 20, -EBADMSG, "cache_blocks"),
		F(flags, 0x80, -EBADMSG, "flags"),
		F(numa_node, -5, -EBADMSG, "numa_node"),
		F(block_bytes, 4096, -EBADMSG, "block_bytes"),
		F(block_stride, 8192, -EBADMSG, "block_stride"),
		F(page_bytes, 64, -EBADMSG, "page_bytes"),
		F(data_bytes, 4096, -EBADMSG, "data_bytes"),
		F(meta_bytes, 4096, -EBADMSG, "offsets"),
		F(pool_off, 0, -EBADMSG, "offsets"),
		F(slots_off, 64, -EBADMSG, "offsets"),
		F(desc_off, 1 << 30, -EBADMSG, "offsets"),
		F(l0_off, 0, -EBADMSG, "offsets"),
		F(l1_off, -1, -EBADMSG, "offsets"),
		F(l0_words, 1, -EBADMSG, "offsets"),
		F(l1_words, 100, -EBADMSG, "offsets"),
		F(idx_off, 4096, -EBADMSG, "offsets"),
		F(idx_entries, 1 << 20, -EBADMSG, "offsets"),
		F(bmeta_off, 0, -EBADMSG, "offsets"),
		F(backend, 2, -EBADMSG, "backend 2"),
		F(reserved1, 1, -EBADMSG, "reserved1"),
		F(ipc, KVA_IPC_FD, -EBADMSG, "GPU region's fields"),
		F(granularity, 1 << 21, -EBADMSG, "GPU region's fields"),
		F(chunks, 1, -EBADMSG, "GPU region's fields"),
		/* a byte of it: the field is wider than the value */
		{ "device_uuid", offsetof(struct kva__header, device_uuid), 1, 1, -EBADMSG,
		  "GPU region's fields" },
#undef F
	};

	for (unsigned k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct kva__header h = f->good;
		int64_t v = cases[k].value;

		memcpy((uint8_t *)&h + cases[k].off, &v, cases[k].size); /* little-endian */
		h.checksum = kva__header_checksum(&h);
		put_header(f, &h);
		if (try_open(f) != cases[k].err || !strstr(kva_errmsg(), cases[k].says))
			fail_msg("%s = %lld: got \"%s\"", cases[k].field, (long long)v, kva_errmsg());
	}
	{
		struct kva__header h = f->good;

		memset(h.name, 'x', sizeof(h.name)); /* no terminating NUL */
		h.checksum = kva__header_checksum(&h);
		put_header(f, &h);
		assert_int_equal(try_open(f), -EBADMSG);
		assert_non_null(strstr(kva_errmsg(), "name"));
	}
	put_header(f, &f->good);
	assert_int_equal(try_open(f), 0);
}

/* A sealed memfd holding @bytes of @src's start, padded to @size. */
static int copy_region(int src, size_t bytes, size_t size, bool seal)
{
	int fd = memfd_create("copy", MFD_ALLOW_SEALING);
	char *buf = calloc(1, bytes ? bytes : 1);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (bytes) {
		assert_int_equal(pread(src, buf, bytes, 0), (ssize_t)bytes);
		assert_int_equal(pwrite(fd, buf, bytes, 0), (ssize_t)bytes);
	}
	free(buf);
	if (seal)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
	return fd;
}

/*
 * A GPU arena's header: opened as a host arena it is -EMEDIUMTYPE (its data
 * is the agent's to hand out), read-only without a data fd it opens; and
 * each GPU field is checked, with a valid checksum, as the host ones are.
 */
static void test_a_gpu_arena_header_is_checked_too(void **state)
{
	struct fixture *f = *state;
	struct kva__header g = f->good, h;
	struct kva_arena *b = NULL;
	const uint64_t gran = 1 << 16;

	g.backend = KVA_BACKEND_CUDA;
	g.ipc = KVA_IPC_FD;
	g.granularity = gran;
	g.map_bytes = (g.data_bytes + gran - 1) / gran * gran;
	g.chunk_bytes = 4 * gran;
	g.chunks = (uint32_t)((g.map_bytes + g.chunk_bytes - 1) / g.chunk_bytes);
	g.device_total = 1ull << 34;
	memset(g.device_uuid, 0x42, sizeof(g.device_uuid));
	snprintf(g.device_name, sizeof(g.device_name), "a device");
	g.flags = 0;
	g.numa_node = -1;
	g.checksum = kva__header_checksum(&g);
	put_header(f, &g);
	assert_int_equal(try_open(f), -EMEDIUMTYPE);
	assert_non_null(strstr(kva_errmsg(), "on a GPU"));
	assert_int_equal(kva_arena_open_flags(f->meta_fd, f->data_fd, KVA_OPEN_READONLY, &b),
			 -EBADF);
	assert_int_equal(kva_arena_open_flags(f->meta_fd, -1, KVA_OPEN_READONLY, &b), 0);
	assert_int_equal(kva_arena_info(b)->backend, KVA_BACKEND_CUDA);
	assert_int_equal(kva_arena_info(b)->chunks, g.chunks);
	assert_string_equal(kva_arena_info(b)->device_uuid,
			    "GPU-42424242-4242-4242-4242-424242424242");
	assert_int_equal(kva_arena_data_fd(b), -EMEDIUMTYPE);
	kva_arena_close(b);

	/* each field wrong, the checksum right */
	for (int k = 0; k < 10; k++) {
		const char *says = NULL;

		h = g;
		switch (k) {
		case 0: h.ipc = 3; says = "ipc 3"; break;
		case 1: h.granularity = 3000; says = "granularity"; break;
		case 2: h.chunk_bytes = gran + 1; says = "not multiples"; break;
		case 3: h.map_bytes -= gran; says = "a range of"; break;
		case 4: h.map_bytes += gran; says = "a range of"; break;
		case 5: h.chunks++; says = "chunks of"; break;
		case 6: h.chunks = KVA_MAX_CHUNKS + 1; says = "chunks of"; break;
		case 7: h.ipc = KVA_IPC_LEGACY; says = "legacy IPC with"; break;
		case 8: h.flags = KVA__HDR_HUGETLB; says = "huge pages"; break;
		case 9: memset(h.device_name, 'x', sizeof(h.device_name)); says = "device name"; break;
		}
		h.checksum = kva__header_checksum(&h);
		put_header(f, &h);
		b = NULL;
		if (kva_arena_open_flags(f->meta_fd, -1, KVA_OPEN_READONLY, &b) != -EBADMSG ||
		    !strstr(kva_errmsg(), says))
			fail_msg("case %d: got \"%s\", not \"%s\"", k, kva_errmsg(), says);
		assert_null(b);
	}
	/* legacy: one allocation of the data exactly */
	h = g;
	h.ipc = KVA_IPC_LEGACY;
	h.chunks = 1;
	h.chunk_bytes = h.map_bytes = h.data_bytes;
	h.granularity = 0;
	h.checksum = kva__header_checksum(&h);
	put_header(f, &h);
	assert_int_equal(kva_arena_open_flags(f->meta_fd, -1, KVA_OPEN_READONLY, &b), 0);
	assert_int_equal(kva_arena_info(b)->ipc, KVA_IPC_LEGACY);
	kva_arena_close(b);
	put_header(f, &f->good);
	assert_int_equal(try_open(f), 0);
}

static void test_wrong_files_are_refused(void **state)
{
	struct fixture *f = *state;
	struct kva_arena *b = NULL;
	size_t meta = f->good.meta_bytes, data = f->good.data_bytes;
	int p[2], fd;

	assert_int_equal(kva_arena_open(-1, f->data_fd, &b), -EBADF);
	assert_int_equal(kva_arena_open(f->meta_fd, -1, &b), -EBADF);
	assert_int_equal(pipe(p), 0);
	assert_int_equal(kva_arena_open(p[0], f->data_fd, &b), -EBADF);
	close(p[0]);
	close(p[1]);
	/* the two regions swapped: the data region is no header */
	assert_int_equal(kva_arena_open(f->data_fd, f->meta_fd, &b), -EBADMSG);

	fd = copy_region(f->meta_fd, meta, meta, false); /* not sealed */
	assert_int_equal(kva_arena_open(fd, f->data_fd, &b), -EBADMSG);
	assert_non_null(strstr(kva_errmsg(), "sealed"));
	/* sealed against shrink and grow, but open to more seals: a holder could
	 * seal it against writable mappings, and every later attach would fail */
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	assert_int_equal(kva_arena_open(fd, f->data_fd, &b), -EBADMSG);
	assert_non_null(strstr(kva_errmsg(), "further seals"));
	close(fd);
	fd = copy_region(f->meta_fd, 0, 0, true);         /* empty */
	assert_int_equal(kva_arena_open(fd, f->data_fd, &b), -EBADMSG);
	assert_non_null(strstr(kva_errmsg(), "shorter"));
	close(fd);
	fd = copy_region(f->meta_fd, meta, meta + 4096, true); /* longer than it says */
	assert_int_equal(kva_arena_open(fd, f->data_fd, &b), -EBADMSG);
	assert_non_null(strstr(kva_errmsg(), "metadata file"));
	close(fd);
	fd = copy_region(f->data_fd, 0, data - 4096, true);   /* data too short */
	assert_int_equal(kva_arena_open(f->meta_fd, fd, &b), -EBADMSG);
	assert_non_null(strstr(kva_errmsg(), "data file"));
	close(fd);
	fd = copy_region(f->data_fd, 0, data, false);         /* data not sealed */
	assert_int_equal(kva_arena_open(f->meta_fd, fd, &b), -EBADMSG);
	close(fd);
	assert_null(b);
	assert_int_equal(kva_arena_open(f->meta_fd, f->data_fd, NULL), -EINVAL);
}

static void test_sealed_regions_cannot_be_truncated(void **state)
{
	struct fixture *f = *state;

	assert_int_equal(ftruncate(f->meta_fd, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(f->data_fd, 4096), -1);
	assert_int_equal(ftruncate(f->data_fd, (off_t)f->good.data_bytes * 2), -1);
}

static void test_open_handle_survives_a_scribbled_header(void **state)
{
	struct fixture *f = *state;
	struct kva__header junk;
	struct kva_worker *w;
	uint32_t ids[5];

	memset(&junk, 0xee, sizeof(junk));
	put_header(f, &junk);
	/* the handle validated and copied the header when it opened */
	assert_int_equal(kva_worker_join(f->a, "w", &w), 0);
	assert_int_equal(kva_alloc(w, 5, ids), 0);
	assert_int_equal(kva_free(w, ids, 5), 0);
	kva_worker_leave(w);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	assert_int_equal(try_open(f), -EBADMSG);
	put_header(f, &f->good);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_every_flipped_header_bit_is_refused, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_each_field_is_checked_even_with_a_valid_checksum,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_gpu_arena_header_is_checked_too, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wrong_files_are_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sealed_regions_cannot_be_truncated, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_open_handle_survives_a_scribbled_header, setup,
						teardown),
	};

	return cmocka_run_group_tests_name("arena_header", tests, NULL, NULL);
}
