/* SPDX-License-Identifier: MIT */
/*
 * The udp transport, for the verbs that bind it to a context: RoCEv2 over
 * UDP, the packet slots of an ops table (engine/engine.h struct
 * sv_transport_ops).  The engine reaches it only through the table.
 */
#ifndef SV_TRANSPORT_UDP_H
#define SV_TRANSPORT_UDP_H

struct sv_transport_ops;
extern const struct sv_transport_ops sv_transport_udp;

#endif
