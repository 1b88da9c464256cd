/* SPDX-License-Identifier: MIT */
/* The device nodes and sysfs entries RDMA stacks look for (view.c). */
#ifndef SV_TOOLS_VIEW_H
#define SV_TOOLS_VIEW_H

#include <stdbool.h>

/* This process (and what it runs) gets its own view; 0 or an errno. */
int sv_view_enter(void);
/* Root: the same for the whole host, or (remove) taken away again. */
int sv_view_setup_host(bool remove);
/* What failed, for the message. */
const char *sv_view_why(void);

#endif
