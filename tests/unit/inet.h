/* SPDX-License-Identifier: MIT */
/* Shared by the rdma_cm and rsocket tests: a clock and loopback addresses. */
#ifndef SV_TEST_INET_H
#define SV_TEST_INET_H

#include <arpa/inet.h>
#include <stdint.h>
#include <time.h>

static inline double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline struct sockaddr_in loopback(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

#endif
