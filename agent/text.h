/* SPDX-License-Identifier: MIT */
/*
 * text.h - text that came from outside (a peer's name, bytes of shared
 * memory) made safe to print: for the agent's log and kvarena-ctl alike.
 */
#ifndef KVA_AGENT_TEXT_H
#define KVA_AGENT_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* the length of the well-formed, printable UTF-8 character at @p (@left
 * bytes from there), or 0: C0, DEL and C1 controls, surrogates, overlong
 * forms and stray bytes are not */
size_t text_char(const unsigned char *p, size_t left);
/* @s is at most @max bytes, all printable UTF-8 */
bool text_printable(const char *s, size_t max);
/* @in into @out (@cap bytes, NUL-terminated), each byte that is not
 * printable UTF-8 written as \xNN (the log) or as '?' (@lossy: ctl's
 * output, JSON strings valid by construction) */
void text_escape(const char *in, char *out, size_t cap, bool lossy);

#endif
