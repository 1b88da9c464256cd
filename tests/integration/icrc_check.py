#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Recomputes the RoCEv2 ICRC of every UDP frame to port 4791 in pcap files.

    python3 tests/integration/icrc_check.py FILE.pcap [FILE.pcap ...] [--port N|any]

An independent check of src/transport/udp/icrc.c: nothing here calls the C
code.  The ICRC (IBA 7.8.1, Annex A17.8) is zlib's crc32 over
  8 bytes of ones (the LRH RoCEv2 does not carry),
  the IP header as captured with IPv4 TOS, TTL and header checksum, or IPv6
  traffic class, flow label and hop limit, set to ones,
  the UDP header with its checksum set to ones,
  the UDP payload with BTH byte 4 (resv8a: FECN, BECN) set to ones,
  without the last 4 bytes, which carry the ICRC little-endian (as Linux rxe
  stores it, and as a ConnectX-4 Lx sends it).
The IP header is the one in the capture, not one rebuilt from addresses.

Reads classic pcap (either byte order, micro- or nanosecond) with Ethernet
(VLAN tags skipped), raw IP, and Linux cooked (SLL, SLL2) link types.
Prints one line per bad ICRC ("frame N: ..."), then the count checked; exits
1 when any ICRC is wrong, 2 when a file cannot be read, 0 otherwise.
"""
import argparse
import struct
import sys
import zlib

ROCEV2_PORT = 4791

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_VLAN = (0x8100, 0x88A8, 0x9100)


class BadFile(Exception):
    pass


def records(path):
    """Yields (frame number, link type, captured bytes, original length)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise BadFile(f"{path}: too short for a pcap header")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    elif magic == b"\x0a\x0d\x0d\x0a":
        raise BadFile(f"{path}: pcapng; convert with editcap -F pcap")
    else:
        raise BadFile(f"{path}: not a pcap file")
    linktype = struct.unpack(end + "I", data[20:24])[0] & 0x0FFFFFFF
    off, number = 24, 0
    while off < len(data):
        if off + 16 > len(data):
            raise BadFile(f"{path}: truncated record header after frame {number}")
        _, _, incl, orig = struct.unpack(end + "IIII", data[off:off + 16])
        off += 16
        if off + incl > len(data):
            raise BadFile(f"{path}: frame {number + 1} truncated")
        number += 1
        yield number, linktype, data[off:off + incl], orig
        off += incl


def network_layer(linktype, frame):
    """(ethertype, bytes from the IP header on), or None."""
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) < 14:
            return None
        off = 12
        etype = struct.unpack(">H", frame[off:off + 2])[0]
        while etype in ETH_P_VLAN and len(frame) >= off + 6:
            off += 4
            etype = struct.unpack(">H", frame[off:off + 2])[0]
        return etype, frame[off + 2:]
    if linktype == LINKTYPE_LINUX_SLL and len(frame) >= 16:
        return struct.unpack(">H", frame[14:16])[0], frame[16:]
    if linktype == LINKTYPE_LINUX_SLL2 and len(frame) >= 20:
        return struct.unpack(">H", frame[0:2])[0], frame[20:]
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6) and frame:
        return (ETH_P_IP if frame[0] >> 4 == 4 else ETH_P_IPV6), frame
    return None


def masked_headers(etype, net, port):
    """(masked IP and UDP headers, UDP payload) of a RoCEv2 frame, or None."""
    if etype == ETH_P_IP:
        if len(net) < 20 or net[0] >> 4 != 4:
            return None
        ihl = (net[0] & 0xF) * 4
        total = struct.unpack(">H", net[2:4])[0]
        frag = struct.unpack(">H", net[6:8])[0]
        if net[9] != 17 or frag & 0x3FFF or len(net) < ihl + 8:
            return None  # not UDP, or a fragment: no whole datagram here
        ip = bytearray(net[:ihl])
        ip[1] = 0xFF             # TOS
        ip[8] = 0xFF             # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
        rest = net[ihl:total]
    elif etype == ETH_P_IPV6:
        if len(net) < 48 or net[0] >> 4 != 6 or net[6] != 17:
            return None  # extension headers are not RoCEv2's
        ip = bytearray(net[:40])
        ip[0] |= 0x0F            # traffic class (high nibble)
        ip[1:4] = b"\xff\xff\xff"  # traffic class (low nibble), flow label
        ip[7] = 0xFF             # hop limit
        plen = struct.unpack(">H", net[4:6])[0]
        rest = net[40:40 + plen]
    else:
        return None
    if len(rest) < 8:
        return None
    sport, dport, ulen = struct.unpack(">HHH", rest[:6])
    if port is not None and dport != port:
        return None
    udp = bytearray(rest[:8])
    udp[6:8] = b"\xff\xff"       # UDP checksum
    return bytes(ip) + bytes(udp), rest[8:ulen]


def icrc(headers, payload):
    body = bytearray(payload[:-4])
    body[4] = 0xFF               # BTH resv8a
    return zlib.crc32(b"\xff" * 8 + headers + bytes(body))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", metavar="FILE.pcap")
    ap.add_argument("--port", default=str(ROCEV2_PORT),
                    help="RoCEv2 UDP destination port, or 'any' for every UDP "
                         "frame (default %(default)s)")
    args = ap.parse_args(argv)
    if args.port == "any":
        port = None
    elif args.port.isdigit() and int(args.port) < 65536:
        port = int(args.port)
    else:
        ap.error(f"--port {args.port}: a port number or 'any'")

    checked = bad = skipped = 0
    for path in args.files:
        try:
            for number, linktype, frame, orig in records(path):
                net = network_layer(linktype, frame)
                if net is None:
                    continue
                found = masked_headers(net[0], net[1], port)
                if found is None:
                    continue
                headers, payload = found
                if len(frame) < orig or len(payload) < 12 + 4:
                    skipped += 1  # cut by the snap length, or no BTH
                    continue
                want = struct.unpack("<I", payload[-4:])[0]
                got = icrc(headers, payload)
                checked += 1
                if got != want:
                    bad += 1
                    where = f"{path}: " if len(args.files) > 1 else ""
                    print(f"{where}frame {number}: ICRC 0x{want:08x} on the wire, "
                          f"0x{got:08x} computed (opcode 0x{payload[0]:02x})")
        except (OSError, BadFile) as e:
            print(f"icrc_check: {e}", file=sys.stderr)
            return 2
    extra = f", {skipped} skipped (truncated or too short)" if skipped else ""
    print(f"checked {checked} RoCEv2 frames, {bad} bad{extra}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
