/* SPDX-License-Identifier: MIT */
#ifndef SV_TOOLS_GUARD_H
#define SV_TOOLS_GUARD_H
/* softverbs __guard (tools/guard.c). */
int guard_main(void);
#endif
