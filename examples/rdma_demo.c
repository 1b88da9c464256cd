/* SPDX-License-Identifier: MIT */
/*
 * Two processes, one RC connection, every operation, and the three
 * classic pitfalls -- using only <infiniband/verbs.h>.
 *
 *   rdma_demo server [PORT]          (waits for the client)
 *   rdma_demo client HOST [PORT]
 *
 * The peers swap what RDMA needs out of band, over TCP: QPN, LID and GID,
 * PSN, and for one-sided operations the buffer's address and rkey.  Then:
 *
 *   1. SEND/RECV: the server posts a receive, the client sends into it.
 *   2. RDMA WRITE, READ, ATOMIC: the client works on the server's memory;
 *      the server's CPU takes no part.
 *   3. Pitfall "SEND vs WRITE": a SEND with no receive posted is refused
 *      by the receiver (RNR) until the retries run out; a WRITE needs none.
 *   4. Pitfall "MR lifetime": a WRITE to an rkey the server deregistered
 *      fails with IBV_WC_REM_ACCESS_ERR.
 *   5. Pitfall "QP state": posting before RTS, or skipping INIT, is EINVAL.
 *
 * Run it on softverbs with SOFTVERBS_EXPLAIN=1 to see each failure
 * explained on stderr.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "rdma_demo: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define SIZE 4096

/* What the peers exchange over TCP. */
struct info {
	uint32_t qpn, psn, rkey, rkey2;
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr, addr2;
};

struct side {
	bool server;
	int sock;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr, *mr2;
	char *buf, *buf2;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct info peer;
};

static void xchg(struct side *s, const void *out, void *in, size_t len)
{
	if (write(s->sock, out, len) != (ssize_t)len || read(s->sock, in, len) != (ssize_t)len)
		DIE("out-of-band exchange failed");
}

/* Both sides reach this point before either goes on. */
static void barrier(struct side *s)
{
	char a = 'b', b;
	xchg(s, &a, &b, 1);
}

static int tcp(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				  .ai_flags = host ? 0 : AI_PASSIVE }, *ai;
	int one = 1, fd;

	if (getaddrinfo(host, port, &hints, &ai))
		DIE("cannot resolve %s", host ? host : "localhost");
	fd = socket(ai->ai_family, ai->ai_socktype, 0);
	if (host) {
		for (int i = 0; connect(fd, ai->ai_addr, ai->ai_addrlen); i++) {
			if (i == 50)
				DIE("cannot connect to %s:%s", host, port);
			usleep(100000);
		}
	} else {
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1))
			DIE("cannot listen on port %s", port);
		int c = accept(fd, NULL, NULL);
		close(fd);
		fd = c;
	}
	freeaddrinfo(ai);
	return fd;
}

/* A fresh QP, connected to the peer's fresh QP: RESET -> INIT -> RTR -> RTS. */
static void connect_qp(struct side *s, uint8_t rnr_retry)
{
	struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				       .cap = { 16, 16, 1, 1, 0 } };
	if (s->qp)
		ibv_destroy_qp(s->qp);
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->qp)
		DIE("ibv_create_qp: %s", strerror(errno));

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("RESET->INIT failed");

	struct info me = { .qpn = s->qp->qp_num, .psn = (uint32_t)lrand48() & 0xffffff,
			   .lid = s->port.lid, .gid = s->gid, .rkey = s->mr->rkey,
			   .addr = (uintptr_t)s->buf, .rkey2 = s->mr2 ? s->mr2->rkey : 0,
			   .addr2 = (uintptr_t)s->buf2 };
	xchg(s, &me, &s->peer, sizeof(me));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = s->port.active_mtu;
	a.dest_qp_num = s->peer.qpn;
	a.rq_psn = s->peer.psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;		/* 0.01 ms: short RNR waits for the demo */
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = s->peer.lid;
	if (s->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;	/* RoCE addresses by GID */
		a.ah_attr.grh.dgid = s->peer.gid;
		a.ah_attr.grh.hop_limit = 64;
	}
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("INIT->RTR failed");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me.psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = rnr_retry;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTR->RTS failed");
}

static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	int n;

	while (!(n = ibv_poll_cq(s->cq, 1, &wc)))
		;
	if (n < 0)
		DIE("ibv_poll_cq failed");
	return wc;
}

static struct ibv_wc op(struct side *s, enum ibv_wr_opcode opcode, void *buf, uint32_t len,
			uint64_t raddr, uint32_t rkey, uint64_t add)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = opcode, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = add;
	}
	int ret = ibv_post_send(s->qp, &wr, &bad);
	if (ret)
		DIE("ibv_post_send: %s", strerror(ret));
	return wait_wc(s);
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, SIZE, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(s->qp, &wr, &bad))
		DIE("ibv_post_recv failed");
}

static void operations(struct side *s)
{
	connect_qp(s, 7);
	printf("\n1. SEND/RECV\n");
	if (s->server) {
		post_recv(s);			/* the receiver must be ready first */
		barrier(s);
		struct ibv_wc wc = wait_wc(s);
		printf("   server received %u bytes: \"%s\" (%s)\n", wc.byte_len, s->buf,
		       ibv_wc_status_str(wc.status));
	} else {
		barrier(s);
		strcpy(s->buf, "hello over SEND");
		struct ibv_wc wc = op(s, IBV_WR_SEND, s->buf, 16, 0, 0, 0);
		printf("   client SEND completed: %s\n", ibv_wc_status_str(wc.status));
	}
	barrier(s);

	printf("\n2. RDMA WRITE, READ, ATOMIC (the server only waits)\n");
	if (!s->server) {
		strcpy(s->buf, "written by the client");
		struct ibv_wc wc = op(s, IBV_WR_RDMA_WRITE, s->buf, 22, s->peer.addr + 64, s->peer.rkey, 0);
		printf("   WRITE 22 bytes to 0x%llx rkey 0x%x: %s\n",
		       (unsigned long long)s->peer.addr + 64, s->peer.rkey, ibv_wc_status_str(wc.status));
		wc = op(s, IBV_WR_RDMA_READ, s->buf + 512, 22, s->peer.addr + 64, s->peer.rkey, 0);
		printf("   READ it back: \"%s\" (%s)\n", s->buf + 512, ibv_wc_status_str(wc.status));
		for (int i = 0; i < 3; i++) {
			wc = op(s, IBV_WR_ATOMIC_FETCH_AND_ADD, s->buf + 1024, 8, s->peer.addr + 2048,
				s->peer.rkey, 10);
			printf("   FETCH_AND_ADD +10: old value %llu (%s)\n",
			       (unsigned long long)*(uint64_t *)(s->buf + 1024), ibv_wc_status_str(wc.status));
		}
	}
	barrier(s);
	if (s->server)
		printf("   server's memory now holds \"%s\" and counter %llu\n", s->buf + 64,
		       (unsigned long long)*(uint64_t *)(s->buf + 2048));
}

static void pitfall_send_vs_write(struct side *s)
{
	printf("\n3. Pitfall: SEND needs a posted receive, WRITE does not\n");
	connect_qp(s, 1);	/* rnr_retry 1: give up after one retry */
	if (!s->server) {
		struct ibv_wc wc = op(s, IBV_WR_SEND, s->buf, 8, 0, 0, 0);
		printf("   SEND with no receive posted: %s (status %d)\n", ibv_wc_status_str(wc.status),
		       wc.status);
	}
	barrier(s);
	connect_qp(s, 1);
	if (!s->server) {
		struct ibv_wc wc = op(s, IBV_WR_RDMA_WRITE, s->buf, 8, s->peer.addr, s->peer.rkey, 0);
		printf("   WRITE, still no receive posted: %s\n", ibv_wc_status_str(wc.status));
	}
	barrier(s);
}

static void pitfall_mr_lifetime(struct side *s)
{
	printf("\n4. Pitfall: an rkey dies with its MR\n");
	connect_qp(s, 7);	/* the client learns mr2's rkey here */
	if (s->server) {
		ibv_dereg_mr(s->mr2);
		s->mr2 = NULL;
		printf("   server deregistered the second MR; the client still holds its rkey\n");
	}
	barrier(s);
	if (!s->server) {
		struct ibv_wc wc = op(s, IBV_WR_RDMA_WRITE, s->buf, 8, s->peer.addr2, s->peer.rkey2, 0);
		printf("   WRITE to rkey 0x%x: %s (status %d)\n", s->peer.rkey2,
		       ibv_wc_status_str(wc.status), wc.status);
	}
	barrier(s);
}

static void pitfall_qp_state(struct side *s)
{
	printf("\n5. Pitfall: a QP must walk RESET -> INIT -> RTR -> RTS\n");
	if (s->server)
		return;
	struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
				       .cap = { 1, 1, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	printf("   RESET -> RTR, skipping INIT: %s\n", strerror(ret));
	struct ibv_sge sge = { (uintptr_t)s->buf, 8, s->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	ret = ibv_post_send(qp, &wr, &bad);
	printf("   ibv_post_send on a QP in RESET: %s\n", strerror(ret));
	ibv_destroy_qp(qp);
}

int main(int argc, char **argv)
{
	struct side s = { 0 };
	struct ibv_device **list;

	if (argc < 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) ||
	    (!strcmp(argv[1], "client") && argc < 3)) {
		fprintf(stderr, "usage: rdma_demo server [PORT] | rdma_demo client HOST [PORT]\n");
		return 2;
	}
	s.server = !strcmp(argv[1], "server");
	const char *port = argc > (s.server ? 2 : 3) ? argv[s.server ? 2 : 3] : "18515";
	srand48(getpid());

	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		DIE("no RDMA device");
	s.ctx = ibv_open_device(list[0]);
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 32, NULL, NULL, 0);
	s.buf = calloc(1, SIZE);
	s.buf2 = calloc(1, SIZE);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		     IBV_ACCESS_REMOTE_ATOMIC;
	s.mr = ibv_reg_mr(s.pd, s.buf, SIZE, access);
	s.mr2 = ibv_reg_mr(s.pd, s.buf2, SIZE, access);
	if (!s.ctx || !s.pd || !s.cq || !s.mr || !s.mr2)
		DIE("setting up verbs objects failed: %s", strerror(errno));
	ibv_query_port(s.ctx, 1, &s.port);
	/* On RoCE, GID 1 is the IPv4-mapped ::ffff:127.0.0.1 on softverbs. */
	ibv_query_gid(s.ctx, 1, s.port.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0, &s.gid);
	printf("%s on %s: LID 0x%04x, link layer %s\n", s.server ? "server" : "client",
	       ibv_get_device_name(list[0]), s.port.lid,
	       s.port.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
	s.sock = tcp(s.server ? NULL : argv[2], port);

	operations(&s);
	pitfall_send_vs_write(&s);
	pitfall_mr_lifetime(&s);
	pitfall_qp_state(&s);
	barrier(&s);

	ibv_destroy_qp(s.qp);
	ibv_dereg_mr(s.mr);
	if (s.mr2)
		ibv_dereg_mr(s.mr2);
	ibv_destroy_cq(s.cq);
	ibv_dealloc_pd(s.pd);
	ibv_close_device(s.ctx);
	ibv_free_device_list(list);
	free(s.buf);
	free(s.buf2);
	close(s.sock);
	return 0;
}
