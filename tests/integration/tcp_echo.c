/* SPDX-License-Identifier: MIT */
/*
 * A plain TCP program for the librspreload test: it knows nothing of
 * RDMA.  The server counts and checksums what it reads until end of file
 * and writes "BYTES SUM" back; the client writes LEN patterned bytes,
 * shuts its side down, reads the answer and exits 0 when it matches.
 *
 *   tcp_echo server|fork-server PORT [ADDR]
 *   tcp_echo client PORT [LEN [ADDR]]
 *
 * fork-server serves the connection it accepts in a child process.
 *
 * ADDR is an IPv4 address, 127.0.0.1 by default.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long fold(unsigned long sum, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sum = sum * 31 + p[i];
	return sum;
}

static int serve(int s, int c);

/* fork: the connection is served by a child, as a forking server does;
 * the parent closes its copy and waits for the child's verdict. */
static int server(int s, struct sockaddr_in *a, int fork_it)
{
	int one = 1, c, st;

	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)a, sizeof(*a)) || listen(s, 1)) {
		perror("tcp_echo: bind/listen");
		return 1;
	}
	c = accept(s, NULL, NULL);
	if (c < 0) {
		perror("tcp_echo: accept");
		return 1;
	}
	if (!fork_it)
		return serve(s, c);
	pid_t pid = fork();
	if (pid < 0) {
		perror("tcp_echo: fork");
		return 1;
	}
	if (pid == 0)
		_exit(serve(s, c));
	close(c);
	close(s);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	return WEXITSTATUS(st);
}

static int serve(int s, int c)
{
	unsigned char buf[65536];
	unsigned long sum = 0, n = 0;
	char out[64];
	int m;
	ssize_t k;

	while ((k = read(c, buf, sizeof(buf))) > 0) {
		sum = fold(sum, buf, (size_t)k);
		n += (unsigned long)k;
	}
	m = snprintf(out, sizeof(out), "%lu %lu", n, sum);
	if (write(c, out, (size_t)m) != m)
		perror("tcp_echo: write");
	close(c);
	close(s);
	printf("server: %s\n", out);
	fflush(stdout);
	return 0;
}

static int client(int s, struct sockaddr_in *a, size_t len)
{
	unsigned char *d = malloc(len);
	char in[64] = { 0 }, want[64];
	size_t got = 0;
	ssize_t k;

	if (!d || connect(s, (struct sockaddr *)a, sizeof(*a))) {
		perror("tcp_echo: connect");
		return 1;
	}
	for (size_t i = 0; i < len; i++)
		d[i] = (unsigned char)(i * 7 + i / 4093);
	for (size_t off = 0; off < len; off += (size_t)k) {
		k = write(s, d + off, len - off);
		if (k <= 0) {
			perror("tcp_echo: write");
			return 1;
		}
	}
	shutdown(s, SHUT_WR);
	while (got < sizeof(in) - 1 && (k = read(s, in + got, sizeof(in) - 1 - got)) > 0)
		got += (size_t)k;
	snprintf(want, sizeof(want), "%zu %lu", len, fold(0, d, len));
	printf("client: %s (%s)\n", in, strcmp(in, want) ? "MISMATCH" : "match");
	free(d);
	return strcmp(in, want) != 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int s;

	if (argc < 3) {
		fprintf(stderr, "usage: tcp_echo server|fork-server PORT [ADDR] | client PORT [LEN [ADDR]]\n");
		return 2;
	}
	a.sin_port = htons((uint16_t)atoi(argv[2]));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	const char *addr = strcmp(argv[1], "client") ? (argc > 3 ? argv[3] : NULL) :
			   (argc > 4 ? argv[4] : NULL);
	if (addr && inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
		fprintf(stderr, "tcp_echo: %s is not an IPv4 address\n", addr);
		return 2;
	}
	s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0) {
		perror("tcp_echo: socket");
		return 1;
	}
	if (!strcmp(argv[1], "server") || !strcmp(argv[1], "fork-server"))
		return server(s, &a, !strcmp(argv[1], "fork-server"));
	return client(s, &a, argc > 3 ? strtoul(argv[3], NULL, 0) : 4u << 20);
}
