#!/usr/bin/python3
"""softverbs across two hosts against the kernel's TCP and UDP, on one veth.

    bench/hosts.py [--quick] [--reps N] [--mtu BYTES] [--only REGEX] [--build DIR] [--out DIR]

Needs root.  Makes two network namespaces joined by a veth pair
(198.18.0.1/30 and 198.18.0.2/30, the RFC 2544 benchmarking range; nothing
else is routed), runs every server in the first pinned to core 1 and every
client in the second pinned to core 0, and compares, in one run with the
repetitions interleaved:

  - softverbs' RoCEv2 over UDP (perftest in RoCE mode, the GID of each
    host's veth address): ib_send_lat, ib_write_lat, ib_read_lat at 8 B,
    ib_write_bw at 1 MiB, and the 8-byte message rate of ib_write_bw and
    ib_send_bw;
  - UCX over the kernel's TCP: uct am_lat on the tcp transport (both veth
    ends are named svb0, since a uct test opens the device the client names
    on both sides) and ucp tag_lat with UCX_TLS=tcp;
  - qperf's tcp_lat, udp_lat and tcp_bw (its 64 KiB writes, and 1 MiB ones);
  - the kernel's floor for ib_send_lat's exchange (sv_probe udp_floor: each
    way one UDP GSO datagram of an 8-byte SEND and the previous one's ACK,
    with softverbs' socket options and no verbs work between the calls),
    set beside the latency targets' peers: how near any RoCEv2 stack over
    the kernel's UDP sockets can come to each goal on this machine.

Every pair is bracketed by bench/run.py's cache-line probe, which labels the
core placement ("near"/"far"); ratios are only formed within one regime.
Then an idle softverbs process with an RC QP connected over UDP is sampled
for its CPU use (sv_probe idle).

The veth's MTU is --mtu (9000 by default, as RoCE fabrics are set up: the
port's active MTU follows it, 4096; 1500 gives 1024); it is the same link
for every program.  Writes results.json and table.md to --out (default
build/bench-hosts).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (bench/run.py: probes, output parsers, reaping)

ADDR_A, ADDR_B = '198.18.0.1', '198.18.0.2'
IFNAME = 'svb0'
RXE_PUBLISHED_GBPS = 0.6  # rxe's own published figure (reference/anchors.md)

# The targets: (softverbs case, peer case or a number, kind, goal).
TARGETS = [
    ('sv ib_send_lat 8B', 'ucx uct am_lat tcp 8', 'lat', 1.0),
    ('sv ib_send_lat 8B', 'qperf udp_lat', 'lat', 0.5),
    ('sv ib_write_bw 1048576', 'qperf tcp_bw', 'bw', 1.0),
    ('sv ib_write_bw 1048576', 'qperf tcp_bw 1M', 'bw', 1.0),
    ('sv ib_write_bw 1048576', RXE_PUBLISHED_GBPS, 'bw', 5.0),
]


# What the kernel's path alone reaches, beside each latency target.
FLOORS = [
    ('udp floor 8B', 'ucx uct am_lat tcp 8'),
    ('udp floor 8B', 'qperf udp_lat'),
    ('sv ib_send_lat 8B', 'udp floor 8B'),
]


def sh(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f'{" ".join(cmd)}: {p.stderr.strip()}')
    return p.stdout


class Hosts:
    def __init__(self, mtu):
        self.a, self.b = f'svbA-{os.getpid()}', f'svbB-{os.getpid()}'
        self.mtu = mtu

    def __enter__(self):
        for ns in (self.a, self.b):
            sh(['ip', 'netns', 'add', ns])
            sh(['ip', '-n', ns, 'link', 'set', 'lo', 'up'])
        sh(['ip', 'link', 'add', 'svbtmp', 'netns', self.a, 'type', 'veth', 'peer', 'name', 'svbtmp',
            'netns', self.b])
        for ns, addr in ((self.a, ADDR_A), (self.b, ADDR_B)):
            sh(['ip', '-n', ns, 'link', 'set', 'svbtmp', 'name', IFNAME])
            sh(['ip', '-n', ns, 'link', 'set', IFNAME, 'mtu', str(self.mtu)])
            sh(['ip', '-n', ns, 'addr', 'add', f'{addr}/30', 'dev', IFNAME])
            sh(['ip', '-n', ns, 'link', 'set', IFNAME, 'up'])
        return self

    def __exit__(self, *exc):
        for ns in (self.a, self.b):
            for pid in sh(['ip', 'netns', 'pids', ns], check=False).split():
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            sh(['ip', 'netns', 'del', ns], check=False)

    def gid_index(self, ns, addr, env):
        out = subprocess.run(['ip', 'netns', 'exec', ns, 'ibv_devinfo', '-v'], env=env,
                             capture_output=True, text=True).stdout
        m = re.search(r'GID\[\s*(\d+)\]:\s+::ffff:' + re.escape(addr) + r', RoCE v2', out)
        if not m:
            raise RuntimeError(f'{ns}: no RoCE v2 GID for {addr}:\n{out}')
        return m.group(1)

    def tx_bytes(self, ns):
        return int(sh(['ip', 'netns', 'exec', ns, 'cat', f'/sys/class/net/{IFNAME}/statistics/tx_bytes']))


def run_pair(h, server, client, env, timeout=120, server_grace=30):
    """Server in A on core 1, client in B on core 0: (client output, server output, rcs,
    bytes each way on the veth)."""
    rss = [os.path.join(run.BUILD, 'bin', 'sv_probe'), 'rss']
    a0, b0 = h.tx_bytes(h.a), h.tx_bytes(h.b)
    srv = subprocess.Popen(['ip', 'netns', 'exec', h.a] + rss + ['taskset', '-c', '1'] + server,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    time.sleep(0.5)
    cli = subprocess.Popen(['ip', 'netns', 'exec', h.b] + rss + ['taskset', '-c', '0'] + client,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    out, crc, _ = run.reap(cli, timeout)
    srv_out, src, _ = run.reap(srv, server_grace)
    return out, srv_out, (crc, src), (h.tx_bytes(h.a) - a0, h.tx_bytes(h.b) - b0)


def cases(quick):
    """(name, kind, args, unit)."""
    n_lat, n_bw, n_rate = ('500', '100', '20000') if quick else ('20000', '2000', '1000000')
    c = []
    for t in ('ib_send_lat', 'ib_write_lat', 'ib_read_lat'):
        c.append((f'sv {t} 8B', 'perftest', [t, '-s', '8', '-n', n_lat], 'us'))
    c.append(('sv ib_write_bw 1048576', 'perftest', ['ib_write_bw', '-s', '1048576', '-n', n_bw], 'GB/s'))
    for t in ('ib_write_bw', 'ib_send_bw'):
        c.append((f'sv {t} 8B rate', 'perftest', [t, '-s', '8', '-n', n_rate], 'Mpps'))
    n_ucx = '2000' if quick else '100000'
    c.append(('ucx uct am_lat tcp 8', 'ucx', ['-t', 'am_lat', '-x', 'tcp', '-d', IFNAME, '-s', '8',
                                             '-n', n_ucx], 'us'))
    c.append(('ucx ucp tag_lat tcp 8', 'ucx-tcp', ['-t', 'tag_lat', '-s', '8', '-n', n_ucx], 'us'))
    c.append(('udp floor 8B', 'floor', [n_ucx], 'us'))
    for t in ('tcp_lat', 'udp_lat', 'tcp_bw'):
        c.append((f'qperf {t}', 'qperf', [t], 'us' if t.endswith('lat') else 'GB/s'))
    # qperf's tcp_bw writes 64 KiB at a time; the same 1 MiB as ib_write_bw too.
    c.append(('qperf tcp_bw 1M', 'qperf', ['-m', '1M', 'tcp_bw'], 'GB/s'))
    return c


def perftest_rate(out):
    """perftest bw: the message rate (Mpps) of the last size row."""
    rows = [l.split() for l in out.splitlines() if re.match(r'^\s+\d+\s+\d+\s+[\d.]+', l)]
    return float(rows[-1][4]) if rows else None


def run_case(h, case, env_sv, gids, port, quick):
    name, kind, args, unit = case
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS='n')
    if kind == 'perftest':
        srv = args + ['-p', str(port), '-x', gids[0]]
        cli = args + ['-p', str(port), '-x', gids[1], ADDR_A]
        out, srv_out, rcs, wire = run_pair(h, srv, cli, env_sv)
        if unit == 'Mpps':
            v = perftest_rate(out)
        else:
            v = run.perftest_value(out, unit == 'us')
    elif kind == 'floor':
        probe = os.path.join(run.BUILD, 'bin', 'sv_probe')
        out, srv_out, rcs, wire = run_pair(
            h, [probe, 'udp_floor', 'server', ADDR_B, ADDR_A, str(port), args[0]],
            [probe, 'udp_floor', 'client', ADDR_A, ADDR_B, str(port), args[0]], env)
        m = re.search(r'udp_floor_oneway_us=([\d.]+)', out)
        v = float(m.group(1)) if m and rcs == (0, 0) else None
    elif kind.startswith('ucx'):
        if '-' in kind:
            env['UCX_TLS'] = kind.split('-', 1)[1]
        out, srv_out, rcs, wire = run_pair(h, ['ucx_perftest', '-p', str(port)],
                                           ['ucx_perftest', ADDR_A, '-p', str(port)] + args, env)
        v = run.ucx_value(out, unit == 'us')
    else:
        out, srv_out, rcs, wire = run_pair(h, ['qperf', '-lp', str(port)],
                                           ['qperf', '-lp', str(port), '-t', '1' if quick else '5',
                                            ADDR_A] + args, env, timeout=60, server_grace=0.5)
        v = run.qperf_value(out, unit == 'us')
    # A figure counts only if its traffic crossed the veth.
    if v is not None and min(wire) <= 0:
        out += f'\n(no traffic on the veth: {wire})'
        v = None
    return v, out + '\n-- server --\n' + srv_out, wire


def idle_cpu(h, env_sv, seconds):
    out = subprocess.run(['ip', 'netns', 'exec', h.a, os.path.join(run.BUILD, 'bin', 'sv_probe'),
                          'idle', str(seconds)], env=dict(env_sv, SOFTVERBS_TRANSPORT='udp'),
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    m = re.search(r'idle_cpu_pct=([\d.]+)', out)
    return (float(m.group(1)) if m else None), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--quick', action='store_true')
    ap.add_argument('--reps', type=int, default=None)
    ap.add_argument('--mtu', type=int, default=9000)
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--out', default=None)
    ap.add_argument('--only', default=None, help='run only the cases whose name matches this regex')
    args = ap.parse_args()
    if os.geteuid():
        sys.exit('bench/hosts.py needs root: it makes network namespaces and a veth')
    # A TERM (a timeout, ^C's cousin) unwinds too, so the hosts go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    build = run.BUILD = os.path.abspath(args.build)
    out_dir = os.path.abspath(args.out or os.path.join(build, 'bench-hosts'))
    os.makedirs(out_dir, exist_ok=True)
    reps = args.reps or (1 if args.quick else 3)
    env_sv = dict(os.environ, LD_LIBRARY_PATH=os.path.join(build, 'lib'), SOFTVERBS_LINK_LAYER='roce')
    env_sv.pop('SOFTVERBS_TRANSPORT', None)

    results, failed = [], []
    with Hosts(args.mtu) as h:
        gids = (h.gid_index(h.a, ADDR_A, env_sv), h.gid_index(h.b, ADDR_B, env_sv))
        all_cases = [c for c in cases(args.quick) if not args.only or re.search(args.only, c[0])]
        sv = [c for c in all_cases if c[1] == 'perftest']
        peers = [c for c in all_cases if c[1] != 'perftest']
        order = [c for pair in zip(sv, peers + [None] * len(sv)) for c in pair if c] + peers[len(sv):]
        port = 19900
        for rep in range(reps):
            for case in order:
                if not args.quick:
                    run.idle_wait()
                before, ns0 = run.probe_regime(build)
                port += 1
                v, raw, wire = run_case(h, case, env_sv, gids, port, args.quick)
                after, ns1 = run.probe_regime(build)
                regime = before if before == after else 'mixed'
                results.append({'case': case[0], 'rep': rep, 'value': v, 'unit': case[3],
                                'regime': regime, 'probe_ns': [ns0, ns1], 'veth_bytes': list(wire)})
                print(f'{case[0]:<28} {v if v is not None else "FAILED":>10} {case[3]:<5} {regime}',
                      flush=True)
                if v is None:
                    failed.append(case[0])
                    with open(os.path.join(out_dir, 'failed.log'), 'a') as f:
                        f.write(f'== {case[0]}\n{raw}\n')
        idle, idle_out = idle_cpu(h, env_sv, 3 if args.quick else 10)

    # Across a veth the core placement matters less than on shared memory,
    # and a pair whose probes disagree ("mixed") is common: "all" pools
    # every run, labelled as such, beside the per-regime columns.
    regimes = ('far', 'near', 'all')
    lines = [f'veth MTU {args.mtu}; servers in one namespace on core 1, clients in the other on core 0',
             '', '| case | unit | far | near | all runs |', '|---|---|---|---|---|']
    by = run.by_regime(results, regimes)
    for case in dict.fromkeys(r['case'] for r in results):
        unit = next(r['unit'] for r in results if r['case'] == case)
        lines.append(f'| {case} | {unit} | ' +
                     ' | '.join(run.median_cell(by.get((case, reg))) for reg in regimes) + ' |')
    lines += ['', '| target | regime | softverbs | peer | ratio | goal | met |',
              '|---|---|---|---|---|---|---|']
    for svc, peer, kind, goal in TARGETS:
        for reg in regimes:
            a = by.get((svc, reg))
            b = [peer] if isinstance(peer, float) else by.get((peer, reg))
            if not a or not b:
                continue
            ratio = statistics.median(a) / statistics.median(b)
            met = ratio <= goal if kind == 'lat' else ratio >= goal
            pname = f"rxe's published {peer} GB/s" if isinstance(peer, float) else peer
            lines.append(f'| {svc} vs {pname} | {reg} | {statistics.median(a):.3g} | '
                         f'{statistics.median(b):.3g} | {ratio:.2f}x | '
                         f'{"<=" if kind == "lat" else ">="} {goal}x | {"yes" if met else "no"} |')
    # A repetition runs every case once, interleaved, within a few
    # minutes; the machine's speed drifts more between repetitions (UCX's
    # am_lat 7.4 and 9.4 us in two runs of one morning).  The ratio of a
    # target's two cases within each repetition, and their median, beside
    # the ratio of medians above; every regime pooled.
    lines += ['', '| target, paired by repetition | ratios | median | goal | met |',
              '|---|---|---|---|---|']
    val = {(r['case'], r['rep']): r['value'] for r in results if r['value'] is not None}
    for svc, peer, kind, goal in TARGETS:
        if isinstance(peer, float):
            continue
        rs = [val[(svc, k)] / val[(peer, k)] for k in range(reps)
              if (svc, k) in val and (peer, k) in val]
        if rs:
            m = statistics.median(rs)
            met = m <= goal if kind == 'lat' else m >= goal
            lines.append(f'| {svc} vs {peer} | {" ".join(f"{x:.2f}" for x in rs)} | {m:.2f}x | '
                         f'{"<=" if kind == "lat" else ">="} {goal}x | {"yes" if met else "no"} |')
    lines += ['', '| the kernel\'s floor | regime | case | peer | ratio |', '|---|---|---|---|---|']
    for a_case, b_case in FLOORS:
        for reg in regimes:
            a, b = by.get((a_case, reg)), by.get((b_case, reg))
            if a and b:
                ma, mb = statistics.median(a), statistics.median(b)
                lines.append(f'| {a_case} vs {b_case} | {reg} | {ma:.3g} | {mb:.3g} | '
                             f'{ma / mb:.2f}x |')
    lines += ['', f'idle softverbs process with an RC QP over UDP: {idle}% of a core '
              f'({idle_out.strip()})']
    with open(os.path.join(out_dir, 'results.json'), 'w') as f:
        json.dump({'results': results, 'mtu': args.mtu, 'idle_cpu_pct': idle}, f, indent=1)
    with open(os.path.join(out_dir, 'table.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print('\n'.join(lines))
    if failed or idle is None:
        print('no number from: ' + ', '.join(sorted(set(failed)) + ([] if idle is not None else ['idle'])),
              file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
