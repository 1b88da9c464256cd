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

/* ORs a filter's value and mask into the rule; the value is kept masked,
 * so a compare never needs it unmasked. */
static void put(void *val, void *mask, const void *v, const void *m, size_t n)
{
	uint8_t *dv = val, *dm = mask;
	const uint8_t *sv = v, *sm = m;

	for (size_t i = 0; i < n; i++) {
		dm[i] |= sm[i];
		dv[i] |= sv[i] & sm[i];
	}
}

/* A layer a spec implies: an IPv4 spec matches IPv4 frames only. */
static void require(uint8_t *val, uint8_t *mask, uint8_t what)
{
	*val = what;
	*mask = 0xff;
}

static int compile(const struct ibv_flow_attr *a, struct sv_flow_rule *r, const char **why)
{
	const uint8_t *p = (const uint8_t *)(a + 1);

	memset(r, 0, sizeof(*r));
	r->priority = a->priority;
	r->port = a->port;
	r->type = (uint8_t)a->type;
	for (unsigned i = 0; i < a->num_of_specs; i++) {
		/* Specs follow each other at 4-byte alignment (the kernel ABI);
		 * the union wants 8, so each is copied out first. */
		struct ibv_flow_spec spec, *s = &spec;
		memcpy(&spec.hdr, p, sizeof(spec.hdr));
		memcpy(&spec, p, spec.hdr.size < sizeof(spec) ? spec.hdr.size : sizeof(spec));
		size_t need;
		switch (s->hdr.type) {
		case IBV_FLOW_SPEC_ETH:
			need = sizeof(s->eth);
			if (s->hdr.size >= need)
				put(&r->val.eth, &r->mask.eth, &s->eth.val, &s->eth.mask,
				    sizeof(s->eth.val));
			break;
		case IBV_FLOW_SPEC_IPV4:
			need = sizeof(s->ipv4);
			if (s->hdr.size >= need) {
				put(&r->val.ip4.src_ip, &r->mask.ip4.src_ip, &s->ipv4.val,
				    &s->ipv4.mask, sizeof(s->ipv4.val));
				require(&r->val.l3, &r->mask.l3, 4);
			}
			break;
		case IBV_FLOW_SPEC_IPV4_EXT:
			need = sizeof(s->ipv4_ext);
			if (s->hdr.size >= need) {
				put(&r->val.ip4, &r->mask.ip4, &s->ipv4_ext.val, &s->ipv4_ext.mask,
				    sizeof(s->ipv4_ext.val));
				require(&r->val.l3, &r->mask.l3, 4);
			}
			break;
		case IBV_FLOW_SPEC_IPV6:
			need = sizeof(s->ipv6);
			if (s->hdr.size >= need) {
				put(&r->val.ip6, &r->mask.ip6, &s->ipv6.val, &s->ipv6.mask,
				    sizeof(s->ipv6.val));
				require(&r->val.l3, &r->mask.l3, 6);
			}
			break;
		case IBV_FLOW_SPEC_TCP:
		case IBV_FLOW_SPEC_UDP:
			need = sizeof(s->tcp_udp);
			if (s->hdr.size >= need) {
				put(&r->val.l4, &r->mask.l4, &s->tcp_udp.val, &s->tcp_udp.mask,
				    sizeof(s->tcp_udp.val));
				require(&r->val.l4proto, &r->mask.l4proto,
					s->hdr.type == IBV_FLOW_SPEC_TCP ? IPPROTO_TCP : IPPROTO_UDP);
			}
			break;
		default:
			*why = "only ETH, IPV4, IPV4_EXT, IPV6, TCP and UDP specs are supported "
			       "(no tunnels, inner headers, ESP, MPLS or actions)";
			return EOPNOTSUPP;
		}
		if (s->hdr.size < need) {
			*why = "a spec's size is smaller than its type's structure";
			return EINVAL;
		}
		p += s->hdr.size;
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
