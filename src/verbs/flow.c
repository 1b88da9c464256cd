/* SPDX-License-Identifier: MIT */
/*
 * Flow steering rules (ibv_create_flow) for raw packet QPs.  A rule's
 * specs compile into one value/mask pair over struct sv_pkt_key and live
 * in the host registry, where every sender's frame is matched against
 * them (engine/raw.c).  As in the kernel, a rule needs CAP_NET_RAW, and
 * a QP with rules cannot be destroyed before them (EBUSY).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../sv.h"

struct sv_flow {
	struct ibv_flow ibflow;
	struct sv_qp *qp;
	uint32_t slot;
};

bool sv_has_net_raw(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	if (syscall(SYS_capget, &h, d))
		return false;
	return d[CAP_NET_RAW / 32].effective & (1u << (CAP_NET_RAW % 32));
}

/* Each spec type softverbs steers on: where its value and mask sit in the
 * spec, where its filter goes in the key, and the layer it implies (an
 * IPv4 spec matches IPv4 frames only, a UDP spec UDP ones). */
#define SPEC(type_, st, member, l3_, l4_)					\
	{ type_, sizeof(struct st), offsetof(struct st, val), offsetof(struct st, mask),	\
	  offsetof(struct sv_pkt_key, member), sizeof(((struct st *)0)->val), l3_, l4_ }
static const struct spec_info {
	uint32_t type;
	size_t size, val, mask;		/* in the spec */
	size_t key;			/* in struct sv_pkt_key */
	size_t len;			/* of the filter */
	uint8_t l3, l4;
} spec_info[] = {
	SPEC(IBV_FLOW_SPEC_ETH, ibv_flow_spec_eth, eth, 0, 0),
	SPEC(IBV_FLOW_SPEC_IPV4, ibv_flow_spec_ipv4, ip4, 4, 0),	/* src, dst: ip4's head */
	SPEC(IBV_FLOW_SPEC_IPV4_EXT, ibv_flow_spec_ipv4_ext, ip4, 4, 0),
	SPEC(IBV_FLOW_SPEC_IPV6, ibv_flow_spec_ipv6, ip6, 6, 0),
	SPEC(IBV_FLOW_SPEC_TCP, ibv_flow_spec_tcp_udp, l4, 0, IPPROTO_TCP),
	SPEC(IBV_FLOW_SPEC_UDP, ibv_flow_spec_tcp_udp, l4, 0, IPPROTO_UDP),
};
#undef SPEC

static int compile(const struct ibv_flow_attr *a, struct sv_flow_rule *r, const char **why)
{
	const uint8_t *p = (const uint8_t *)(a + 1);
	uint8_t *val = (uint8_t *)&r->val, *mask = (uint8_t *)&r->mask;

	memset(r, 0, sizeof(*r));
	r->priority = a->priority;
	r->port = a->port;
	r->type = (uint8_t)a->type;
	for (unsigned i = 0; i < a->num_of_specs; i++) {
		/* Specs follow each other at 4-byte alignment (the kernel ABI),
		 * so the header is copied out rather than dereferenced. */
		struct { uint32_t type; uint16_t size; } hdr;
		memcpy(&hdr.type, p, sizeof(hdr.type));
		memcpy(&hdr.size, p + sizeof(hdr.type), sizeof(hdr.size));
		const struct spec_info *si = NULL;
		for (size_t k = 0; k < SV_ARRAY_SIZE(spec_info) && !si; k++)
			if (spec_info[k].type == hdr.type)
				si = &spec_info[k];
		if (!si) {
			*why = "only ETH, IPV4, IPV4_EXT, IPV6, TCP and UDP specs are supported "
			       "(no tunnels, inner headers, ESP, MPLS or actions)";
			return EOPNOTSUPP;
		}
		if (hdr.size < si->size) {
			*why = "a spec's size is smaller than its type's structure";
			return EINVAL;
		}
		/* The value is kept masked, so a compare never needs it bare. */
		for (size_t b = 0; b < si->len; b++) {
			mask[si->key + b] |= p[si->mask + b];
			val[si->key + b] |= p[si->val + b] & p[si->mask + b];
		}
		if (si->l3) {
			r->val.l3 = si->l3;
			r->mask.l3 = 0xff;
		}
		if (si->l4) {
			r->val.l4proto = si->l4;
			r->mask.l4proto = 0xff;
		}
		p += hdr.size;
	}
	return 0;
}

struct ibv_flow *sv_create_flow(struct ibv_qp *ibqp, struct ibv_flow_attr *a)
{
	const char *verb = "ibv_create_flow", *why = NULL;
	struct sv_qp *qp = sv_qp(ibqp);
	struct sv_flow_rule r;

	if (!sv_obj_live(ibqp, SV_OBJ_QP))
		return sv_fail_null(EINVAL, verb, "QP %p is not live", (void *)ibqp);
	if (ibqp->qp_type != IBV_QPT_RAW_PACKET)
		return sv_fail_null(EOPNOTSUPP, verb, "qpn 0x%x is %s; flow steering is for raw "
				    "packet QPs", ibqp->qp_num, sv_qp_type_name(ibqp->qp_type));
	if (!sv_has_net_raw())
		return sv_fail_null(EPERM, verb, "steering raw frames needs CAP_NET_RAW");
	if (!a || a->comp_mask || a->port != SV_PORT)
		return sv_fail_null(EINVAL, verb, "attr: comp_mask must be 0 and port %d", SV_PORT);
	if (a->type > IBV_FLOW_ATTR_SNIFFER)
		return sv_fail_null(EINVAL, verb, "flow type %d is unknown", a->type);
	if (a->flags & ~(uint32_t)IBV_FLOW_ATTR_FLAGS_DONT_TRAP)
		return sv_fail_null(EOPNOTSUPP, verb, "flags 0x%x: only DONT_TRAP is accepted "
				    "(frames are copied, never trapped)", a->flags);
	int ret = compile(a, &r, &why);
	if (ret)
		return sv_fail_null(ret, verb, "%s", why);
	struct sv_flow *f = calloc(1, sizeof(*f));
	if (!f)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	if (sv_reg_flow_add(ibqp->qp_num, &r, &f->slot) || sv_obj_add(f, SV_OBJ_FLOW, ibqp->context)) {
		free(f);
		return sv_fail_null(ENOMEM, verb, "the host holds %d flow rules already",
				    SV_HOST_MAX_FLOWS);
	}
	f->qp = qp;
	f->ibflow.context = ibqp->context;
	atomic_fetch_add(&qp->flows, 1);
	return &f->ibflow;
}

void sv_flow_free(void *obj)
{
	struct sv_flow *f = obj;

	sv_reg_flow_del(f->slot, f->qp->ex.qp_base.qp_num);
	atomic_fetch_sub(&f->qp->flows, 1);
	free(f);
}

int sv_destroy_flow(struct ibv_flow *ibflow)
{
	if (!sv_obj_del(ibflow, SV_OBJ_FLOW))
		return sv_fail(EINVAL, "ibv_destroy_flow", "flow %p is not live", (void *)ibflow);
	sv_flow_free(ibflow);
	return 0;
}
