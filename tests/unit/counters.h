/* SPDX-License-Identifier: MIT */
/* For tests linked with sv_internal: what the host registry counted. */
#ifndef SV_TEST_COUNTERS_H
#define SV_TEST_COUNTERS_H

#include <unistd.h>

#include "sv.h"

/* Bytes this process moved by a copy path (host registry counters). */
static inline uint64_t my_bytes(enum sv_copy_path path)
{
	static struct sv_reg_ep_info eps[SV_HOST_MAX_ENDPOINTS];
	int n = sv_reg_list_eps(eps, SV_HOST_MAX_ENDPOINTS);
	uint64_t sum = 0;

	for (int i = 0; i < n; i++)
		if (eps[i].pid == getpid())
			sum += eps[i].bytes[path];
	return sum;
}

#endif
