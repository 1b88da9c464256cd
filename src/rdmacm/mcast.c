/* SPDX-License-Identifier: MIT */
/*
 * Multicast on UD ids.  The group's MGID is the kernel's mapping of the IP
 * group address: on RoCE the IPv4-mapped address (cma_iboe_set_mgid), on
 * InfiniBand the IPoIB mapping ff12:401b:PKEY::a.b.c.d (ip_ib_mc_map)
 * with a multicast LID derived from it.  Membership is the verbs QP's
 * attachment (ibv_attach_mcast), which softverbs keeps host-wide; a
 * send-only member is not attached, so it receives nothing.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cm.h"

bool cm_addr_multicast(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return IN_MULTICAST(ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr));
	return a->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_MULTICAST(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

static bool same_group(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (a->sa_family != b->ss_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		       &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
}

static void map_group(struct ibv_context *ctx, const struct sockaddr *a, union ibv_gid *mgid,
		      uint16_t *mlid)
{
	struct ibv_port_attr pa = { 0 };

	ibv_query_port(ctx, 1, &pa);
	memset(mgid, 0, sizeof(*mgid));
	if (a->sa_family == AF_INET6) {
		memcpy(mgid->raw, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	} else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		mgid->raw[10] = mgid->raw[11] = 0xff;
		memcpy(&mgid->raw[12], &((const struct sockaddr_in *)a)->sin_addr, 4);
	} else {
		static const uint8_t prefix[6] = { 0xff, 0x12, 0x40, 0x1b, 0xff, 0xff };

		memcpy(mgid->raw, prefix, sizeof(prefix));
		memcpy(&mgid->raw[12], &((const struct sockaddr_in *)a)->sin_addr, 4);
	}
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		*mlid = 0;
		return;
	}
	/* An SA would assign the MLID; the group's hash stands in for it,
	 * inside the multicast range 0xC000-0xFFFE (IBA 4.1.3). */
	uint32_t h = 2166136261u;
	for (int i = 0; i < 16; i++)
		h = (h ^ mgid->raw[i]) * 16777619u;
	*mlid = (uint16_t)(0xc000 | (h % 0x3fff));
}

static int join(struct rdma_cm_id *id, struct sockaddr *addr, bool send_only, void *context,
		const char *verb)
{
	struct cm_id *c = cm_of(id);
	struct cm_mcast *m;
	struct cm_event *e;
	int ret;

	if (!id || !addr)
		return cm_fail(EINVAL, NULL, verb, "a NULL argument");
	if (!cm_addr_multicast(addr))
		return cm_fail(EINVAL, c, verb, "the address is not a multicast group");
	pthread_mutex_lock(&cm_mu);
	if ((c->state != CM_BOUND && c->state != CM_ADDR_RESOLVED &&
	     c->state != CM_ROUTE_RESOLVED) || !id->verbs) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, verb, "the id is %s%s; a join needs an address bound to "
			       "the device", cm_state_name(c->state), id->verbs ? "" : " on no device");
	}
	if (id->qp_type != IBV_QPT_UD) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, verb, "multicast is for UD ids (RDMA_PS_UDP or IPOIB)");
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(ENOMEM, c, verb, "out of memory");
	}
	memcpy(&m->addr, addr, cm_addr_len(addr));
	m->context = context;
	m->send_only = send_only;
	map_group(id->verbs, addr, &m->mgid, &m->mlid);
	m->next = c->mcasts;
	c->mcasts = m;
	if (id->qp && !send_only) {
		ret = ibv_attach_mcast(id->qp, &m->mgid, m->mlid);
		if (ret) {
			e = cm_event_queue(c, RDMA_CM_EVENT_MULTICAST_ERROR, -ret);
			if (e) {
				e->ev.param.ud.private_data = context;
				cm_explain_event(c, &e->ev, "ibv_attach_mcast failed");
			}
			goto out;
		}
		m->attached = true;
	}
	e = cm_event_queue(c, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
	if (e) {
		e->mc = m;
		struct rdma_ud_param *u = &e->ev.param.ud;
		struct ibv_port_attr pa = { 0 };

		ibv_query_port(id->verbs, 1, &pa);
		/* The kernel reports the join's context in private_data. */
		u->private_data = context;
		u->qp_num = 0xffffff;
		u->qkey = RDMA_UDP_QKEY;
		u->ah_attr.port_num = 1;
		u->ah_attr.dlid = m->mlid;
		u->ah_attr.is_global = 1;
		u->ah_attr.grh.dgid = m->mgid;
		u->ah_attr.grh.sgid_index = c->sgid_index;
		u->ah_attr.grh.hop_limit = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? 64 : 0;
	}
out:
	ret = cm_sync_wait(c);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

CM_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	return join(id, addr, false, context, "rdma_join_multicast");
}

CM_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id,
				     struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	if (!attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
	    !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
	    attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED)
		return cm_fail(EINVAL, id ? cm_of(id) : NULL, "rdma_join_multicast_ex",
			       "comp_mask must give the address and the join flags");
	if (attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
		return cm_fail(EINVAL, id ? cm_of(id) : NULL, "rdma_join_multicast_ex",
			       "join flag %u is not FULLMEMBER or SENDONLY_FULLMEMBER",
			       attr->join_flags);
	return join(id, attr->addr, attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
		    context, "rdma_join_multicast_ex");
}

static void leave(struct cm_id *c, struct cm_mcast *m)
{
	if (m->attached && c->id.qp)
		ibv_detach_mcast(c->id.qp, &m->mgid, m->mlid);
	free(m);
}

CM_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct cm_id *c = cm_of(id);
	struct cm_mcast **p;

	if (!id || !addr)
		return cm_fail(EINVAL, NULL, "rdma_leave_multicast", "a NULL argument");
	pthread_mutex_lock(&cm_mu);
	for (p = &c->mcasts; *p; p = &(*p)->next)
		if (same_group(addr, &(*p)->addr)) {
			struct cm_mcast *m = *p;

			*p = m->next;
			leave(c, m);
			pthread_mutex_unlock(&cm_mu);
			return 0;
		}
	pthread_mutex_unlock(&cm_mu);
	return cm_fail(EADDRNOTAVAIL, c, "rdma_leave_multicast", "the id has not joined that "
		       "group");
}

/* The join's event is handed out: a QP created since the join is attached
 * now, as librdmacm attaches when it processes the event. */
void cm_mcast_joined(struct cm_id *c, struct cm_mcast *m)
{
	for (struct cm_mcast *i = c->mcasts; i; i = i->next)
		if (i == m && !m->attached && !m->send_only && c->id.qp &&
		    !ibv_attach_mcast(c->id.qp, &m->mgid, m->mlid))
			m->attached = true;
}

void cm_mcast_leave_all(struct cm_id *c)
{
	while (c->mcasts) {
		struct cm_mcast *m = c->mcasts;

		c->mcasts = m->next;
		leave(c, m);
	}
}
