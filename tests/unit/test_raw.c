/* SPDX-License-Identifier: MIT */
/*
 * Raw packet QPs, flow steering and receive side scaling: which QPs a
 * frame reaches (NORMAL rules by priority, the defaults, sniffers, never
 * the sender), the rules' refusals, and the Toeplitz hash checked against
 * Microsoft's published verification vectors.  Raw packet QPs need an
 * Ethernet port (RoCE mode) and CAP_NET_RAW, as with the kernel: without
 * them creation fails with EOPNOTSUPP or EPERM, which is asserted too.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/syscall.h>

#include "helpers.h"
#include "pair.h"

#define FRAME 128

struct raw {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	char *buf;
	struct ibv_mr *mr;
};

static struct fix *F;

static bool net_raw(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	return !syscall(SYS_capget, &h, d) && (d[CAP_NET_RAW / 32].effective & (1u << (CAP_NET_RAW % 32)));
}

static bool roce(void)
{
	return F->port.link_layer == IBV_LINK_LAYER_ETHERNET;
}

static struct ibv_qp *raw_qp(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RAW_PACKET,
				       .cap = { 16, 16, 1, 1, 0 } };
	return ibv_create_qp(F->pd, &ia);
}

static void raw_open(struct raw *r)
{
	r->cq = ibv_create_cq(F->ctx, 64, NULL, NULL, 0);
	r->qp = raw_qp(r->cq);
	assert_non_null(r->qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	assert_int_equal(ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_PORT), 0);
	a.qp_state = IBV_QPS_RTR;
	assert_int_equal(ibv_modify_qp(r->qp, &a, IBV_QP_STATE), 0);
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(ibv_modify_qp(r->qp, &a, IBV_QP_STATE), 0);
	r->buf = calloc(1, 4096);
	r->mr = ibv_reg_mr(F->pd, r->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { (uintptr_t)r->buf + 1024, 1024, r->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 0x77, .sg_list = &sge, .num_sge = 1 }, *bad;
	for (int i = 0; i < 8; i++)
		assert_int_equal(ibv_post_recv(r->qp, &wr, &bad), 0);
}

static void raw_close(struct raw *r)
{
	assert_int_equal(ibv_destroy_qp(r->qp), 0);
	assert_int_equal(ibv_dereg_mr(r->mr), 0);
	assert_int_equal(ibv_destroy_cq(r->cq), 0);
	free(r->buf);
}

static const uint8_t MAC_A[6] = { 0x02, 0, 0, 0, 0, 0xa }, MAC_B[6] = { 0x02, 0, 0, 0, 0, 0xb };
static const uint8_t MAC_SRC[6] = { 0x02, 0, 0, 0, 0, 0x1 };

/* Ethernet | IPv4 | UDP or TCP, addresses and ports in host order. */
static uint32_t frame(char *f, const uint8_t *dmac, uint32_t src, uint32_t dst, uint8_t proto,
		      uint16_t sport, uint16_t dport)
{
	uint8_t *p = (uint8_t *)f;

	memset(p, 0, FRAME);
	memcpy(p, dmac, 6);
	memcpy(p + 6, MAC_SRC, 6);
	p[12] = 0x08;
	uint8_t *ip = p + 14;
	ip[0] = 0x45;
	ip[8] = 64;
	ip[9] = proto;
	uint32_t s = htonl(src), d = htonl(dst);
	memcpy(ip + 12, &s, 4);
	memcpy(ip + 16, &d, 4);
	uint16_t sp = htons(sport), dp = htons(dport);
	memcpy(ip + 20, &sp, 2);
	memcpy(ip + 22, &dp, 2);
	return FRAME;
}

static void raw_send(struct raw *r, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)r->buf, len, r->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	assert_int_equal(ibv_post_send(r->qp, &wr, &bad), 0);
	struct ibv_wc wc = poll_one(r->cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_SEND);
}

/* A rule of one spec on qp. */
struct rule {
	struct ibv_flow_attr attr;
	union {
		struct ibv_flow_spec_eth eth;
		struct ibv_flow_spec_ipv4 ip4;
	} s;
	struct ibv_flow_spec_tcp_udp l4;
};

static struct ibv_flow *flow_eth(struct ibv_qp *qp, const uint8_t *dmac, uint16_t prio)
{
	struct rule r = { .attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(r), .priority = prio,
				    .num_of_specs = 1, .port = 1 } };
	r.s.eth.type = IBV_FLOW_SPEC_ETH;
	r.s.eth.size = sizeof(r.s.eth);
	memcpy(r.s.eth.val.dst_mac, dmac, 6);
	memset(r.s.eth.mask.dst_mac, 0xff, 6);
	return ibv_create_flow(qp, &r.attr);
}

static struct ibv_flow *flow_udp_port(struct ibv_qp *qp, uint16_t port, uint16_t prio)
{
	struct rule r = { .attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(r), .priority = prio,
				    .num_of_specs = 2, .port = 1 } };
	r.s.ip4.type = IBV_FLOW_SPEC_IPV4;
	r.s.ip4.size = sizeof(r.s.eth);	/* the union's size: what follows is l4 */
	r.l4.type = IBV_FLOW_SPEC_UDP;
	r.l4.size = sizeof(r.l4);
	r.l4.val.dst_port = htons(port);
	r.l4.mask.dst_port = 0xffff;
	return ibv_create_flow(qp, &r.attr);
}

static struct ibv_flow *flow_kind(struct ibv_qp *qp, enum ibv_flow_attr_type type)
{
	struct ibv_flow_attr a = { .type = type, .size = sizeof(a), .port = 1 };

	return ibv_create_flow(qp, &a);
}

/* How many frames each receiver got, draining their CQs. */
static int got(struct raw *r)
{
	struct ibv_wc wc;
	int n = 0;

	usleep(1000);
	while (ibv_poll_cq(r->cq, 1, &wc) == 1) {
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.opcode, IBV_WC_RECV);
		assert_int_equal(wc.byte_len, FRAME);
		assert_int_equal(wc.qp_num, r->qp->qp_num);
		n++;
	}
	return n;
}

static void test_availability(void **state)
{
	F = *state;
	errno = 0;
	struct ibv_qp *qp = raw_qp(F->cq);
	if (!roce()) {
		assert_null(qp);
		assert_int_equal(errno, EOPNOTSUPP);
	} else if (!net_raw()) {
		assert_null(qp);
		assert_int_equal(errno, EPERM);
	} else {
		assert_non_null(qp);
		assert_int_equal(ibv_destroy_qp(qp), 0);
	}
}

static void test_steering(void **state)
{
	F = *state;
	if (!roce() || !net_raw())
		skip();
	struct raw snd, a, b, sniff, dflt;
	raw_open(&snd);
	raw_open(&a);
	raw_open(&b);
	raw_open(&sniff);
	raw_open(&dflt);
	struct ibv_flow *fa = flow_eth(a.qp, MAC_A, 2);
	struct ibv_flow *fb = flow_udp_port(b.qp, 4791, 1);
	struct ibv_flow *fs = flow_kind(sniff.qp, IBV_FLOW_ATTR_SNIFFER);
	struct ibv_flow *fd = flow_kind(dflt.qp, IBV_FLOW_ATTR_ALL_DEFAULT);
	struct ibv_flow *fself = flow_kind(snd.qp, IBV_FLOW_ATTR_SNIFFER);
	assert_non_null(fa);
	assert_non_null(fb);
	assert_non_null(fs);
	assert_non_null(fd);
	assert_non_null(fself);

	static const struct {
		const char *what;
		const uint8_t *dmac;
		uint16_t dport;
		int a, b, dflt;
	} cases[] = {
		{ "MAC rule only", MAC_A, 9, 1, 0, 0 },
		{ "both match: the better priority (B's 1) wins", MAC_A, 4791, 0, 1, 0 },
		{ "UDP rule only", MAC_B, 4791, 0, 1, 0 },
		{ "no NORMAL rule: the default", MAC_B, 9, 0, 0, 1 },
	};
	for (size_t i = 0; i < SV_ARRAY_LEN(cases); i++) {
		uint32_t len = frame(snd.buf, cases[i].dmac, 0x0a000001, 0x0a000002, IPPROTO_UDP, 5000,
				     cases[i].dport);
		raw_send(&snd, len);
		int ga = got(&a), gb = got(&b), gd = got(&dflt), gs = got(&sniff);
		if (ga != cases[i].a || gb != cases[i].b || gd != cases[i].dflt || gs != 1)
			fail_msg("%s: a %d b %d default %d sniffer %d", cases[i].what, ga, gb, gd, gs);
		/* The sender's own sniffer never sees its frames. */
		assert_int_equal(got(&snd), 0);
		if (cases[i].a)
			assert_memory_equal(a.buf + 1024, snd.buf, len);
	}
	/* A QP with rules cannot go first; without its rule, A gets nothing. */
	errno = 0;
	assert_int_equal(ibv_destroy_qp(a.qp), EBUSY);
	assert_int_equal(ibv_destroy_flow(fa), 0);
	raw_send(&snd, frame(snd.buf, MAC_A, 1, 2, IPPROTO_UDP, 1, 9));
	assert_int_equal(got(&a), 0);
	assert_int_equal(got(&dflt), 1);
	assert_int_equal(got(&sniff), 1);
	assert_int_equal(ibv_destroy_flow(fb), 0);
	assert_int_equal(ibv_destroy_flow(fs), 0);
	assert_int_equal(ibv_destroy_flow(fd), 0);
	assert_int_equal(ibv_destroy_flow(fself), 0);
	raw_close(&snd);
	raw_close(&a);
	raw_close(&b);
	raw_close(&sniff);
	raw_close(&dflt);
}

static void test_rule_refusals(void **state)
{
	F = *state;
	if (!roce() || !net_raw())
		skip();
	struct ibv_qp *ud = fix_qp(F, IBV_QPT_UD);
	errno = 0;
	assert_null(flow_kind(ud, IBV_FLOW_ATTR_SNIFFER));
	assert_int_equal(errno, EOPNOTSUPP);
	struct ibv_qp *qp = raw_qp(F->cq);
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_tunnel vx;
	} t = { .attr = { .size = sizeof(t), .num_of_specs = 1, .port = 1 },
		.vx = { .type = IBV_FLOW_SPEC_VXLAN_TUNNEL, .size = sizeof(t.vx) } };
	errno = 0;
	assert_null(ibv_create_flow(qp, &t.attr));
	assert_int_equal(errno, EOPNOTSUPP);
	t.vx.type = IBV_FLOW_SPEC_ETH;
	t.vx.size = 4;		/* smaller than an ETH spec */
	errno = 0;
	assert_null(ibv_create_flow(qp, &t.attr));
	assert_int_equal(errno, EINVAL);
	t.attr.num_of_specs = 0;
	t.attr.port = 2;
	errno = 0;
	assert_null(ibv_create_flow(qp, &t.attr));
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_destroy_qp(ud), 0);
}

/* Microsoft's RSS verification key and its IPv4 vectors ("Verifying the
 * RSS Hash Calculation"): 66.9.149.187:2794 -> 161.142.100.80:1766 hashes
 * to 0x323e8fc2 over the addresses and 0x51ccc178 with the TCP ports. */
static const uint8_t MS_KEY[40] = {
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
	0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
	0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
};

#define NWQ 16

static void test_rss(void **state)
{
	F = *state;
	if (!roce() || !net_raw())
		skip();
	struct raw snd;
	raw_open(&snd);
	struct ibv_cq *cq = ibv_create_cq(F->ctx, 256, NULL, NULL, 0);
	struct ibv_wq *wq[NWQ];
	char *buf = calloc(NWQ, 4096);
	struct ibv_mr *mr = ibv_reg_mr(F->pd, buf, NWQ * 4096, IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < NWQ; i++) {
		struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 8, .max_sge = 1,
					       .pd = F->pd, .cq = cq };
		wq[i] = ibv_create_wq(F->ctx, &wa);
		assert_non_null(wq[i]);
		struct ibv_sge sge = { (uintptr_t)buf + i * 4096, 4096, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
		for (int k = 0; k < 8; k++)
			assert_int_equal(ibv_post_wq_recv(wq[i], &wr, &bad), 0);
		struct ibv_wq_attr ma = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY };
		/* WQ 1 stays in RESET: frames hashed to it are dropped. */
		if (i != 1)
			assert_int_equal(ibv_modify_wq(wq[i], &ma), 0);
	}
	struct ibv_rwq_ind_table_init_attr ta = { .log_ind_tbl_size = 4, .ind_tbl = wq };
	struct ibv_rwq_ind_table *tbl = ibv_create_rwq_ind_table(F->ctx, &ta);
	assert_non_null(tbl);
	static const struct {
		uint64_t fields;
		uint8_t proto;
		uint32_t hash;
	} vec[] = {
		{ IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4, IPPROTO_TCP, 0x323e8fc2 },
		{ IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_PORT_TCP |
		  IBV_RX_HASH_DST_PORT_TCP, IPPROTO_TCP, 0x51ccc178 },
	};
	for (size_t v = 0; v < SV_ARRAY_LEN(vec); v++) {
		struct ibv_qp_init_attr_ex qa = {
			.qp_type = IBV_QPT_RAW_PACKET, .pd = F->pd, .rwq_ind_tbl = tbl,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
				     IBV_QP_INIT_ATTR_RX_HASH,
			.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
					  .rx_hash_key_len = sizeof(MS_KEY),
					  .rx_hash_key = (uint8_t *)MS_KEY,
					  .rx_hash_fields_mask = vec[v].fields },
		};
		struct ibv_qp *rss = ibv_create_qp_ex(F->ctx, &qa);
		assert_non_null(rss);
		struct ibv_flow *fl = flow_kind(rss, IBV_FLOW_ATTR_ALL_DEFAULT);
		assert_non_null(fl);
		raw_send(&snd, frame(snd.buf, MAC_A, 0x420995bb, 0xa18e6450, vec[v].proto, 2794, 1766));
		struct ibv_wc wc = poll_one(cq);
		int want = (int)(vec[v].hash & (NWQ - 1));
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, want);
		assert_int_equal(wc.qp_num, wq[want]->wq_num);
		assert_int_equal(ibv_destroy_flow(fl), 0);
		assert_int_equal(ibv_destroy_qp(rss), 0);
	}
	/* The RESET WQ: find a source address that hashes to it, then see
	 * the frame dropped and the SEND still succeed. */
	struct ibv_qp_init_attr_ex qa = {
		.qp_type = IBV_QPT_RAW_PACKET, .pd = F->pd, .rwq_ind_tbl = tbl,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH,
		.rx_hash_conf = { IBV_RX_HASH_FUNC_TOEPLITZ, sizeof(MS_KEY), (uint8_t *)MS_KEY,
				  IBV_RX_HASH_SRC_IPV4 },
	};
	struct ibv_qp *rss = ibv_create_qp_ex(F->ctx, &qa);
	struct ibv_flow *fl = flow_kind(rss, IBV_FLOW_ATTR_ALL_DEFAULT);
	int dropped = 0, delivered = 0;
	for (uint32_t src = 1; src <= 32; src++) {
		raw_send(&snd, frame(snd.buf, MAC_A, src, 2, IPPROTO_UDP, 1, 2));
		struct ibv_wc wc;
		usleep(200);
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			assert_int_not_equal(wc.wr_id, 1);
			delivered++;
		} else {
			dropped++;
		}
	}
	assert_true(dropped > 0 && delivered > dropped);
	/* Objects in use are refused. */
	assert_int_equal(ibv_destroy_rwq_ind_table(tbl), EBUSY);
	assert_int_equal(ibv_destroy_wq(wq[0]), EBUSY);
	assert_int_equal(ibv_destroy_flow(fl), 0);
	assert_int_equal(ibv_destroy_qp(rss), 0);
	assert_int_equal(ibv_destroy_rwq_ind_table(tbl), 0);
	/* ERR flushes what a WQ holds. */
	struct ibv_wq_attr ea = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_ERR };
	assert_int_equal(ibv_modify_wq(wq[0], &ea), 0);
	int flushed = 0;
	struct ibv_wc wc;
	while (ibv_poll_cq(cq, 1, &wc) == 1)
		flushed += wc.status == IBV_WC_WR_FLUSH_ERR;
	assert_true(flushed >= 2);
	for (int i = 0; i < NWQ; i++)
		assert_int_equal(ibv_destroy_wq(wq[i]), 0);
	ibv_dereg_mr(mr);
	free(buf);
	assert_int_equal(ibv_destroy_cq(cq), 0);
	raw_close(&snd);
}

/* A receiver in another process: its rule lives in the host registry and
 * its queue in its own segment; the frame is copied into its memory. */
static void test_across_processes(void **state)
{
	int up[2], down[2];
	char c;

	F = *state;
	if (!roce() || !net_raw())
		skip();
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid_t pid = fix_fork();
	assert_true(pid >= 0);
	if (!pid) {
		/* A context of its own: the parent's belongs to the parent. */
		void *st;
		fix_setup(&st);
		F = st;
		struct raw r;
		raw_open(&r);
		struct ibv_flow *fl = flow_eth(r.qp, MAC_B, 0);
		if (!fl || write(up[1], "r", 1) != 1)
			_exit(2);
		struct ibv_wc wc = poll_one(r.cq);
		char want[FRAME];
		frame(want, MAC_B, 0x0a000001, 0x0a000002, IPPROTO_UDP, 7, 8);
		int bad = wc.status || wc.byte_len != FRAME || memcmp(r.buf + 1024, want, FRAME);
		if (read(down[0], &c, 1) != 1 || ibv_destroy_flow(fl))
			_exit(3);
		raw_close(&r);
		_exit(bad ? 4 : 0);
	}
	struct raw snd;
	raw_open(&snd);
	assert_int_equal(read(up[0], &c, 1), 1);
	raw_send(&snd, frame(snd.buf, MAC_B, 0x0a000001, 0x0a000002, IPPROTO_UDP, 7, 8));
	assert_int_equal(write(down[1], "d", 1), 1);
	assert_child_ok(pid, "receiver");
	raw_close(&snd);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_availability, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_steering, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rule_refusals, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rss, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_across_processes, fix_setup, fix_teardown),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
