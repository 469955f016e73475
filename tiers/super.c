/* SPDX-License-Identifier: MIT */
/*
 * super.c - the disk tier file's superblock, and the test-only fault
 * injection spec (KVA_TIER_INJECT).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tiers_pvt.h"

void tier_super_fill(struct tier_super *s, uint64_t fp, uint64_t record_bytes, uint64_t records,
		     const char *arena)
{
	memset(s, 0, sizeof(*s));
	s->magic = TIER_SUPER_MAGIC;
	s->format = TIER_FORMAT;
	s->super_bytes = sizeof(*s);
	s->fingerprint = fp;
	s->record_bytes = record_bytes;
	s->records = records;
	s->data_off = TIER_ALIGN;
	snprintf(s->arena, sizeof(s->arena), "%s", arena);
	s->hash = XXH3_64bits(s, offsetof(struct tier_super, hash));
}

const char *tier_super_check(const struct tier_super *s)
{
	if (s->magic != TIER_SUPER_MAGIC)
		return "no superblock";
	if (s->hash != XXH3_64bits(s, offsetof(struct tier_super, hash)))
		return "superblock checksum";
	if (s->format != TIER_FORMAT || s->super_bytes != sizeof(*s) || s->data_off != TIER_ALIGN)
		return "another format";
	if (!memchr(s->arena, 0, sizeof(s->arena)))
		return "arena name";
	return NULL;
}

int tier_inject_parse(const char *spec, struct tier_inject *inj, char *err, size_t len)
{
	static const char *const names[INJ_N] = {
		[INJ_WRITE_EIO] = "write-eio", [INJ_READ_EIO] = "read-eio",
		[INJ_WRITE_SHORT] = "write-short", [INJ_READ_SHORT] = "read-short",
		[INJ_WRITE_ENOSPC] = "write-enospc",
	};
	char buf[256], *save = NULL, *tok;

	memset(inj, 0, sizeof(*inj));
	if (!spec || !*spec)
		return 0;
	snprintf(buf, sizeof(buf), "%s", spec);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':'), *end;
		unsigned long long n = 1;
		int k;

		if (!strcmp(tok, "nodirect")) {
			inj->nodirect = inj->any = true;
			continue;
		}
		if (colon) {
			*colon = 0;
			n = strtoull(colon + 1, &end, 10);
			if (*end || !n) {
				snprintf(err, len, "KVA_TIER_INJECT: '%s': a count from 1", colon + 1);
				return -EINVAL;
			}
		}
		for (k = 0; k < INJ_N && strcmp(tok, names[k]); k++)
			;
		if (k == INJ_N) {
			snprintf(err, len, "KVA_TIER_INJECT: '%s': write-eio, read-eio, write-short, "
				 "read-short, write-enospc (:N) or nodirect", tok);
			return -EINVAL;
		}
		inj->from[k] = n;
		inj->any = true;
	}
	return 0;
}
