/* SPDX-License-Identifier: MIT */
/*
 * UD multicast groups.  Membership is host-wide, in the registry: a UD
 * send to the multicast QPN (0xFFFFFF) reaches every QP on the host
 * attached to the group the address vector names (engine/req.c), as a
 * switch replicates a multicast packet to every member port.  On RoCE
 * the packet also leaves for the group's IPv4 address, which the
 * context's link joins for its members (engine/pkt.c), and so reaches
 * members on other hosts.
 *
 * The checks are the kernel's ib_attach_mcast(): a UD QP, a multicast
 * GID, and on InfiniBand a multicast LID (IBA 4.1.3: 0xC000-0xFFFE); on
 * RoCE the LID means nothing and groups are told apart by GID alone.
 */
#include <errno.h>
#include <string.h>

#include "../sv.h"
#include "../engine/engine.h"

static bool mcast_gid(const union ibv_gid *g)
{
	const uint8_t *r = g->raw;
	static const uint8_t v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	/* IPv6 ff00::/8, or an IPv4-mapped 224.0.0.0/4 (RoCEv2). */
	return r[0] == 0xff || (!memcmp(r, v4mapped, 12) && (r[12] & 0xf0) == 0xe0);
}

static int check(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t *lid, const char *verb)
{
	if (!sv_obj_live(qp, SV_OBJ_QP))
		return sv_fail(EINVAL, verb, "QP %p is not live", (void *)qp);
	if (qp->qp_type != IBV_QPT_UD)
		return sv_fail(EINVAL, verb, "qpn 0x%x is %s; only UD QPs join multicast groups",
			       qp->qp_num, sv_qp_type_name(qp->qp_type));
	if (!gid || !mcast_gid(gid))
		return sv_fail(EINVAL, verb, "the GID is not a multicast GID (ff00::/8, or "
			       "::ffff:224.0.0.0/100)");
	if (sv_config()->link == SV_LINK_ROCE) {
		*lid = 0;
	} else if (*lid < 0xc000 || *lid == 0xffff) {
		return sv_fail(EINVAL, verb, "LID 0x%x is not a multicast LID (0xc000-0xfffe)", *lid);
	}
	return 0;
}

SV_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	int ret = check(qp, gid, &lid, "ibv_attach_mcast");

	if (ret)
		return ret;
	ret = sv_reg_mcast_attach(qp->qp_num, gid, lid);
	if (ret)
		return sv_fail(ret, "ibv_attach_mcast", "the host has %d multicast attachments "
			       "already", SV_HOST_MAX_MCAST_ATTACH);
	sv_pkt_mcast(sv_qp(qp), gid, true);
	return 0;
}

SV_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	int ret = check(qp, gid, &lid, "ibv_detach_mcast");

	if (ret)
		return ret;
	ret = sv_reg_mcast_detach(qp->qp_num, gid, lid);
	if (ret)
		return sv_fail(ret, "ibv_detach_mcast", "qpn 0x%x is not attached to that group",
			       qp->qp_num);
	sv_pkt_mcast(sv_qp(qp), gid, false);
	return 0;
}
