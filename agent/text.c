/* SPDX-License-Identifier: MIT */
/*
 * text.c - printable UTF-8, judged byte by byte (text.h).
 */
#include <stdio.h>
#include <string.h>

#include "text.h"

size_t text_char(const unsigned char *p, size_t left)
{
	unsigned c = p[0], n, cp;

	if (c < 0x80)
		return c >= 0x20 && c != 0x7f ? 1 : 0;
	if ((c & 0xe0) == 0xc0)
		n = 1, cp = c & 0x1f;
	else if ((c & 0xf0) == 0xe0)
		n = 2, cp = c & 0x0f;
	else if ((c & 0xf8) == 0xf0)
		n = 3, cp = c & 0x07;
	else
		return 0;
	if (n >= left)
		return 0;
	for (unsigned k = 1; k <= n; k++) {
		if ((p[k] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[k] & 0x3f);
	}
	if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
	    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp < 0xa0))
		return 0;
	return n + 1;
}

bool text_printable(const char *s, size_t max)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t len = strnlen(s, max + 1);

	if (len > max)
		return false;
	for (size_t i = 0, n; i < len; i += n)
		if (!(n = text_char(p + i, len - i)))
			return false;
	return true;
}

void text_escape(const char *in, char *out, size_t cap, bool lossy)
{
	const unsigned char *p = (const unsigned char *)in;
	size_t len = strlen(in), o = 0;

	if (!cap)
		return;
	for (size_t i = 0; i < len && o + 5 < cap;) {
		size_t n = text_char(p + i, len - i);

		if (n) {
			if (o + n >= cap)
				break;
			memcpy(out + o, p + i, n);
			o += n;
			i += n;
		} else if (lossy) {
			out[o++] = '?';
			i++;
		} else {
			o += (size_t)snprintf(out + o, cap - o, "\\x%02x", p[i]);
			i++;
		}
	}
	out[o] = '\0';
}
