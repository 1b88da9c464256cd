/* SPDX-License-Identifier: MIT */
/*
 * Address handles, and the address-vector checks modify_qp shares.
 * A RoCE port needs a GRH in every address vector (IBA A16.4.3 / A17.4.5:
 * RoCE carries no LRH, so the GID is the address).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

int sv_ah_attr_check(const struct sv_device *dev, const struct ibv_ah_attr *ah, const char **why)
{
	if (ah->port_num < 1 || ah->port_num > SV_NUM_PORTS) {
		*why = "ah_attr.port_num must be 1";
		return EINVAL;
	}
	if (ah->sl > 15) {
		*why = "ah_attr.sl must be 0..15";
		return EINVAL;
	}
	if (ah->static_rate > IBV_RATE_800_GBPS) {
		*why = "ah_attr.static_rate is not an enum ibv_rate value";
		return EINVAL;
	}
	if (!ah->is_global) {
		if (sv_port_needs_grh(dev)) {
			*why = "the port's link layer is Ethernet (RoCE), which needs a GRH: set "
			       "ah_attr.is_global=1 and grh.dgid to the peer's GID";
			return EINVAL;
		}
		/* IBA 4.1.3: LID 0 is reserved, it addresses nobody. */
		if (!ah->dlid) {
			*why = "ah_attr.dlid is 0; set it to the peer's port LID (ibv_query_port)";
			return EINVAL;
		}
		return 0;
	}
	if (!sv_gid_entry(dev, ah->grh.sgid_index, NULL, NULL)) {
		*why = "ah_attr.grh.sgid_index names an empty GID table entry";
		return EINVAL;
	}
	static const union ibv_gid zero;
	if (!memcmp(&ah->grh.dgid, &zero, sizeof(zero))) {
		*why = "ah_attr.grh.dgid is all zeros; set it to the peer's GID";
		return EINVAL;
	}
	return 0;
}

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	const char *why, *verb = "ibv_create_ah";
	struct sv_context *c;
	struct sv_ah *ah;

	if (!sv_pd_of(pd, NULL, verb))
		return NULL;
	if (!attr)
		return sv_fail_null(EINVAL, verb, "attr is NULL");
	c = sv_ctx(pd->context);
	int ret = sv_ah_attr_check(c->dev, attr, &why);
	if (ret)
		return sv_fail_null(ret, verb, "%s", why);
	if (atomic_fetch_add(&c->nah, 1) >= SV_MAX_AH) {
		atomic_fetch_sub(&c->nah, 1);
		return sv_fail_null(ENOMEM, verb, "the context has max_ah=%d AHs", SV_MAX_AH);
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah || sv_obj_add(ah, SV_OBJ_AH, pd->context)) {
		free(ah);
		atomic_fetch_sub(&c->nah, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	ah->ibah.context = pd->context;
	ah->ibah.pd = pd;
	ah->attr = *attr;
	ah->pd = sv_pd(pd);
	sv_pd_users_add(ah->pd, 1);
	return &ah->ibah;
}

static void ah_free(struct sv_ah *ah)
{
	sv_pd_users_add(ah->pd, -1);
	atomic_fetch_sub(&sv_ctx(ah->ibah.context)->nah, 1);
	free(ah);
}

void sv_ah_release(struct sv_ah *ah)
{
	if (sv_obj_del(ah, SV_OBJ_AH))
		ah_free(ah);
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah *ibah)
{
	if (!sv_obj_del(ibah, SV_OBJ_AH))
		return sv_fail(EINVAL, "ibv_destroy_ah", "AH %p is not live", (void *)ibah);
	ah_free(sv_ah(ibah));
	return 0;
}

/* The IPv4 header checksum (RFC 791): the ones' complement sum. */
static uint16_t ipv4_csum(const uint8_t *h)
{
	uint32_t sum = 0;

	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)(h[i] << 8 | h[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/*
 * The 40 bytes a UD receive buffer starts with: a GRH (IBA 8.3.1), or for
 * RoCEv2 over IPv4 an IPv4 header in the last 20 bytes.  As rdma-core
 * does, a buffer whose IPv6 version nibble is 6 is still IPv4 when its last
 * 20 bytes are a 5-word IPv4 header with a valid checksum; a GID alone
 * can look like either.
 */
static int grh_version(const struct ibv_grh *grh)
{
	const uint8_t *ip4 = (const uint8_t *)grh + 20;
	bool v4 = (ip4[0] >> 4) == 4;

	if ((ntohl(grh->version_tclass_flow) >> 28) != 6)
		return v4 ? 4 : -1;
	return v4 && (ip4[0] & 0xf) == 5 && ipv4_csum(ip4) == 0 ? 4 : 6;
}

static int grh_to_gids(const struct ibv_grh *grh, union ibv_gid *sgid, union ibv_gid *dgid,
		       uint32_t *flow, uint8_t *tclass)
{
	const uint8_t *ip4 = (const uint8_t *)grh + 20;

	switch (grh_version(grh)) {
	case 4:
		memset(sgid, 0, sizeof(*sgid));
		memset(dgid, 0, sizeof(*dgid));
		sgid->raw[10] = sgid->raw[11] = dgid->raw[10] = dgid->raw[11] = 0xff;
		memcpy(&sgid->raw[12], ip4 + 12, 4);
		memcpy(&dgid->raw[12], ip4 + 16, 4);
		*flow = 0;
		*tclass = ip4[1];
		return 0;
	case 6:
		*sgid = grh->sgid;
		*dgid = grh->dgid;
		*flow = ntohl(grh->version_tclass_flow) & 0xfffff;
		*tclass = (uint8_t)(ntohl(grh->version_tclass_flow) >> 20);
		return 0;
	default:
		return EPROTONOSUPPORT;
	}
}

SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *ctx, uint8_t port, struct ibv_wc *wc,
				  struct ibv_grh *grh, struct ibv_ah_attr *ah)
{
	const char *verb = "ibv_init_ah_from_wc";

	if (!sv_context_live(ctx, verb))
		return -1;
	if (!wc || !ah || ((wc->wc_flags & IBV_WC_GRH) && !grh))
		return sv_fail(EINVAL, verb, "wc, ah_attr and (with IBV_WC_GRH) grh are needed"), -1;
	memset(ah, 0, sizeof(*ah));
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	ah->port_num = port;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0;
	union ibv_gid sgid, dgid;
	if (grh_to_gids(grh, &sgid, &dgid, &ah->grh.flow_label, &ah->grh.traffic_class))
		return sv_fail(EPROTONOSUPPORT, verb, "the receive buffer holds neither an IPv6 "
			       "GRH nor an IPv4 header"), -1;
	/* The reply goes back to the sender: our GID is the packet's dgid. */
	int idx = sv_gid_find(sv_ctx(ctx)->dev, &dgid);
	if (idx < 0)
		return sv_fail(EINVAL, verb, "the GRH's destination GID is not in the GID table"), -1;
	ah->is_global = 1;
	ah->grh.dgid = sgid;
	ah->grh.sgid_index = (uint8_t)idx;
	ah->grh.hop_limit = 0xff;
	return 0;
}

SV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
					       struct ibv_grh *grh, uint8_t port)
{
	struct ibv_ah_attr a;

	if (!sv_pd_of(pd, NULL, "ibv_create_ah_from_wc"))
		return NULL;
	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}
