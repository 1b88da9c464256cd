#!/usr/bin/python3
"""softverbs against its peers, side by side, in one run.

    bench/run.py [--quick] [--reps N] [--build DIR] [--out DIR]

Runs Debian's perftest on softverbs (private and shareable memory) and the
peers a user would pick instead -- UCX's ucx_perftest (uct and ucp) and
qperf -- on localhost, each side pinned to its own core, repetitions
interleaved (softverbs, peer, softverbs, peer, ...).  Every pair is
bracketed by a cache-line ping-pong probe that labels the host's core
placement ("near" ~76 ns, "far" ~300 ns one-way); ratios are only formed
within one regime.  Before each pair it waits for an idle machine.

Output (in --out, default build/bench-results): results.json and results.csv
(every run), table.md (medians [min-max] and the target ratios), and PNG
plots of latency and bandwidth against message size from -a sweeps.
--quick runs one repetition of a subset with few iterations: a smoke
test that each benchmark runs and yields numbers, never a speed check.
"""
import argparse
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, '..', 'build')  # set from --build in main()
MIB_TO_GB = 1.048576 / 1000  # perftest and ucx_perftest print MiB/s


def sh(cmd, env=None, timeout=300):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def idle_wait(limit=20.0):
    """Waits until the 1-minute-ish load is low (two cores: < 0.5), at most `limit` s."""
    t0 = time.time()
    while time.time() - t0 < limit:
        with open('/proc/loadavg') as f:
            if float(f.read().split()[0]) < 0.5:
                return
        time.sleep(1)


def probe_regime(build):
    out = sh([os.path.join(build, 'bin', 'sv_probe'), 'pingpong', '200000']).stdout
    m = re.search(r'pingpong_oneway_ns=([\d.]+)', out)
    ns = float(m.group(1)) if m else float('nan')
    return ('near' if ns < 150 else 'far'), ns


def reap(p, timeout):
    """Output and exit status of a child, which is killed at the deadline
    (qperf's server never ends), and the peak RSS sv_probe rss reported."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The whole group: the launcher, taskset's exec and the program.
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
    m = re.search(r'sv_probe_peak_rss_kib=(\d+)', out or '')
    return out or '', p.returncode, int(m.group(1)) if m else None


def run_pair(server, client, env, port_arg, port, timeout=300, server_grace=30, client_port=True):
    """Server and client pinned to cores 1 and 0: (client out, server out, rcs, peak RSS KiB)."""
    rss = [os.path.join(BUILD, 'bin', 'sv_probe'), 'rss']
    srv = subprocess.Popen(rss + ['taskset', '-c', '1'] + server + port_arg(port), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    time.sleep(0.4)
    cli = subprocess.Popen(rss + ['taskset', '-c', '0'] + client + (port_arg(port) if client_port else []),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    out, crc, crss = reap(cli, timeout)
    srv_out, src, srss = reap(srv, server_grace)
    return out, srv_out, (crc, src), (crss, srss)


def perftest_value(out, lat):
    """perftest: typical latency (us) or average bandwidth (GB/s) of the last size row."""
    rows = [l.split() for l in out.splitlines() if re.match(r'^\s+\d+\s+\d+\s+[\d.]+', l)]
    if not rows:
        return None
    r = rows[-1]
    return float(r[4]) if lat else float(r[3]) * MIB_TO_GB


def perftest_sweep(out, lat):
    rows = [l.split() for l in out.splitlines() if re.match(r'^\s+\d+\s+\d+\s+[\d.]+', l)]
    return [(int(r[0]), float(r[4]) if lat else float(r[3]) * MIB_TO_GB) for r in rows]


def ucx_value(out, lat):
    """ucx_perftest final line: latency (us, its 50%ile) or bandwidth MiB/s."""
    final = [l for l in out.splitlines() if l.strip().startswith('Final:')]
    if not final:
        return None
    f = final[-1].split()
    # Final: iters typ avg overall bw-avg bw-overall msgrate ...
    try:
        return float(f[2]) if lat else float(f[5]) * MIB_TO_GB
    except (IndexError, ValueError):
        return None


def qperf_value(out, lat):
    m = re.search(r'latency\s*=\s*([\d.]+)\s*(ns|us|ms)', out) if lat else \
        re.search(r'bw\s*=\s*([\d.]+)\s*(GB/sec|MB/sec|KB/sec)', out)
    if not m:
        return None
    v = float(m.group(1))
    scale = {'ns': 1e-3, 'us': 1, 'ms': 1e3, 'GB/sec': 1, 'MB/sec': 1e-3, 'KB/sec': 1e-6}
    return v * scale[m.group(2)]


def cases(quick):
    """(name, kind, args, lat?) -- kind picks how it is run and parsed."""
    it_lat, it_bw = ('200', '200') if quick else ('20000', '5000')
    c = []
    for mem, extra in (('private', []), ('shareable', ['--use_hugepages'])):
        for t in ('ib_send_lat', 'ib_write_lat', 'ib_read_lat', 'ib_atomic_lat'):
            if quick and mem == 'shareable' and t != 'ib_write_lat':
                continue
            c.append((f'sv {t} 8B {mem}', 'perftest', [t, '-s', '8', '-n', it_lat] + extra, True))
        for t in ('ib_write_bw', 'ib_read_bw', 'ib_send_bw'):
            for size in ('65536', '1048576'):
                if quick and (size == '65536' or t == 'ib_read_bw'):
                    continue
                c.append((f'sv {t} {size} {mem}', 'perftest', [t, '-s', size, '-n', it_bw] + extra, False))
    n_lat, n_bw = ('2000', '200') if quick else ('200000', '5000')
    uct = [('put_lat', 'posix', 'short', '8', True), ('put_lat', 'sysv', 'short', '8', True),
           ('put_lat', 'cma', 'zcopy', '8', True), ('am_lat', 'posix', 'short', '8', True),
           ('put_bw', 'posix', 'bcopy', '65536', False), ('put_bw', 'posix', 'bcopy', '1048576', False),
           ('put_bw', 'sysv', 'bcopy', '1048576', False), ('put_bw', 'cma', 'zcopy', '65536', False),
           ('put_bw', 'cma', 'zcopy', '1048576', False)]
    for t, tl, mode, size, lat in uct:
        if quick and (tl == 'sysv' or size == '65536'):
            continue
        c.append((f'ucx uct {t} {tl} {size}', 'ucx', ['-t', t, '-x', tl, '-d', 'memory', '-D', mode,
                                                       '-s', size, '-n', n_lat if lat else n_bw], lat))
    for tls in ('sm', 'tcp'):
        c.append((f'ucx ucp tag_lat {tls} 8', 'ucx-' + tls, ['-t', 'tag_lat', '-s', '8', '-n', n_lat], True))
        for t in ('tag_bw', 'stream_bw'):
            if quick and t == 'stream_bw':
                continue
            c.append((f'ucx ucp {t} {tls} 1048576', 'ucx-' + tls, ['-t', t, '-s', '1048576', '-n', n_bw], False))
    for t in ('tcp_lat', 'udp_lat', 'tcp_bw'):
        c.append((f'qperf {t}', 'qperf', [t], t.endswith('lat')))
    return c


def run_case(case, build, port, quick):
    """(value, raw output, peak RSS KiB of client and server)."""
    name, kind, args, lat = case
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS='n')
    if kind == 'perftest':
        env['LD_LIBRARY_PATH'] = os.path.join(build, 'lib')
        out, _, _, rss = run_pair(args, args + ['localhost'], env, lambda p: ['-p', str(p)], port)
        return perftest_value(out, lat), out, rss
    if kind.startswith('ucx'):
        if '-' in kind:
            env['UCX_TLS'] = kind.split('-', 1)[1]
        out, _, _, rss = run_pair(['ucx_perftest'], ['ucx_perftest', '127.0.0.1'] + args, env,
                                  lambda p: ['-p', str(p)], port)
        return ucx_value(out, lat), out, rss
    if kind == 'qperf':
        # qperf's server serves one client; its listen port is -lp.
        # qperf takes its options before the host and the test names.
        out, _, _, rss = run_pair(['qperf'], ['qperf', '-lp', str(port), '-t', '1' if quick else '5',
                                              '127.0.0.1'] + args,
                                  env, lambda p: ['-lp', str(p)], port, timeout=60, server_grace=0.5,
                                  client_port=False)
        return qperf_value(out, lat), out, rss
    raise ValueError(kind)


def qp_memory(build):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(build, 'lib'))
    out = sh([os.path.join(build, 'bin', 'sv_probe'), 'qpmem', '256'], env=env).stdout
    m = re.search(r'shm_bytes_per_idle_qp=([\d.]+)', out)
    return float(m.group(1)) if m else None


# The targets: (softverbs case, peer case, comparison, goal).
TARGETS = [
    ('sv ib_send_lat 8B private', 'ucx ucp tag_lat sm 8', 'lat', 1.0),
    ('sv ib_write_lat 8B shareable', 'ucx uct put_lat posix 8', 'lat', 1.2),
    ('sv ib_write_lat 8B private', 'ucx uct put_lat cma 8', 'lat', 1.0),
    ('sv ib_write_bw 1048576 private', 'ucx uct put_bw cma 1048576', 'bw', 1.2),
    ('sv ib_write_bw 1048576 shareable', 'ucx uct put_bw posix 1048576', 'bw', 0.9),
    ('sv ib_read_lat 8B private', 'sv ib_write_lat 8B private', 'lat', 1.5),
    ('sv ib_atomic_lat 8B private', 'sv ib_write_lat 8B private', 'lat', 1.5),
]


def sweep_plots(build, out_dir, quick):
    """-a sweeps of write latency and bandwidth, private and shareable, plotted with gnuplot."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(build, 'lib'))
    data = {}
    for t, lat in (('ib_write_lat', True), ('ib_write_bw', False)):
        for mem, extra in (('private', []), ('shareable', ['--use_hugepages'])):
            n = '100' if quick else ('2000' if lat else '500')
            out, _, _, _ = run_pair([t, '-a', '-n', n] + extra, [t, '-a', '-n', n] + extra + ['localhost'],
                                    env, lambda p: ['-p', str(p)], 18700 + len(data))
            pts = perftest_sweep(out, lat)
            data[(t, mem)] = pts
            with open(os.path.join(out_dir, f'{t}_{mem}.dat'), 'w') as f:
                for size, v in pts:
                    f.write(f'{size} {v}\n')
    if not shutil.which('gnuplot'):
        return data
    for t, ylabel in (('ib_write_lat', 'typical latency (us)'), ('ib_write_bw', 'bandwidth (GB/s)')):
        script = (f"set terminal png size 800,500 noenhanced; set output '{out_dir}/{t}.png';"
                  f"set logscale x 2; set xlabel 'message size (bytes)'; set ylabel '{ylabel}';"
                  f"set title 'softverbs {t} -a: private (CMA) vs shareable (direct)'; set key left top;"
                  f"plot '{out_dir}/{t}_private.dat' with linespoints title 'private memory',"
                  f" '{out_dir}/{t}_shareable.dat' with linespoints title 'SysV shm (--use_hugepages)'")
        sh(['gnuplot', '-e', script])
    return data


def by_regime(results, regimes=('far', 'near')):
    """{(case, regime): [values]} of the runs that gave a number, per core
    placement; 'all' (when asked for) pools every run whatever its regime."""
    by = {}
    for r in results:
        if r['value'] is None:
            continue
        for reg in regimes:
            if reg == 'all' or r['regime'] == reg:
                by.setdefault((r['case'], reg), []).append(r['value'])
    return by


def median_cell(vals):
    if not vals:
        return 'n/a'
    return f'{statistics.median(vals):.3g} [{min(vals):.3g}-{max(vals):.3g}] (n={len(vals)})'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--quick', action='store_true')
    ap.add_argument('--reps', type=int, default=None)
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--out', default=None)
    args = ap.parse_args()
    global BUILD
    build = BUILD = os.path.abspath(args.build)
    out_dir = os.path.abspath(args.out or os.path.join(build, 'bench-results'))
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, 'failed.log')):
        os.unlink(os.path.join(out_dir, 'failed.log'))
    reps = args.reps or (1 if args.quick else 3)

    # Shareable memory: perftest's --use_hugepages needs huge pages.
    try:
        with open('/proc/sys/vm/nr_hugepages', 'r+') as f:
            if int(f.read()) < 64:
                f.seek(0)
                f.write('64')
    except OSError:
        pass

    # The machine's limits: CMA at 8 B and 1 MiB, memcpy at 1 MiB.
    probes = {}
    for label, probe in (('cma_8B', ['cma', '8', '20000']), ('cma_1MiB', ['cma', '1048576', '2000']),
                         ('memcpy_1MiB', ['memcpy', '1048576', '2000'])):
        out = sh([os.path.join(build, 'bin', 'sv_probe')] + probe).stdout
        for key, val in (l.split('=', 1) for l in out.split() if '=' in l):
            if not key.endswith('_size'):
                probes[f'{label}.{key}'] = float(val)

    results = []
    all_cases = cases(args.quick)
    sv_cases = [c for c in all_cases if c[1] == 'perftest']
    peer_cases = [c for c in all_cases if c[1] != 'perftest']
    # Interleave: softverbs, peer, softverbs, peer, ...
    order = []
    for i in range(max(len(sv_cases), len(peer_cases))):
        if i < len(sv_cases):
            order.append(sv_cases[i])
        if i < len(peer_cases):
            order.append(peer_cases[i])
    port = 19800
    for rep in range(reps):
        for case in order:
            if not args.quick:
                idle_wait()
            before, ns0 = probe_regime(build)
            port += 1
            value, raw, rss = run_case(case, build, port, args.quick)
            after, ns1 = probe_regime(build)
            regime = before if before == after else 'mixed'
            results.append({'case': case[0], 'rep': rep, 'value': value,
                            'unit': 'us' if case[3] else 'GB/s', 'regime': regime,
                            'probe_ns': [ns0, ns1], 'peak_rss_kib': list(rss)})
            print(f'{case[0]:<40} {value if value is not None else "FAILED":>10} '
                  f'{"us" if case[3] else "GB/s":<5} {regime}', flush=True)
            if value is None:
                with open(os.path.join(out_dir, 'failed.log'), 'a') as f:
                    f.write(f'== {case[0]}\n{raw}\n')

    qp_mem = qp_memory(build)
    sweeps = sweep_plots(build, out_dir, args.quick)
    with open(os.path.join(out_dir, 'results.json'), 'w') as f:
        json.dump({'results': results, 'probes': probes, 'shm_bytes_per_idle_qp': qp_mem,
                   'sweeps': {f'{k[0]} {k[1]}': v for k, v in sweeps.items()}}, f, indent=1)
    with open(os.path.join(out_dir, 'results.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['case', 'rep', 'value', 'unit', 'regime', 'client_rss_kib', 'server_rss_kib'])
        for r in results:
            w.writerow([r['case'], r['rep'], r['value'], r['unit'], r['regime']] + r['peak_rss_kib'])

    # Tables: medians per regime, then the target ratios within a regime.
    lines = ['| case | unit | far | near | peak RSS KiB (client/server) |', '|---|---|---|---|---|']
    by = by_regime(results)
    for case in dict.fromkeys(r['case'] for r in results):
        unit = next(r['unit'] for r in results if r['case'] == case)
        rss = next(r['peak_rss_kib'] for r in results if r['case'] == case)
        lines.append(f'| {case} | {unit} | {median_cell(by.get((case, "far")))} | '
                     f'{median_cell(by.get((case, "near")))} | {rss[0]}/{rss[1]} |')
    lines += ['', '| target | regime | softverbs | peer | ratio | goal | met |', '|---|---|---|---|---|---|---|']
    for sv, peer, kind, goal in TARGETS:
        for reg in ('far', 'near'):
            a, b = by.get((sv, reg)), by.get((peer, reg))
            if not a or not b:
                continue
            ratio = statistics.median(a) / statistics.median(b)
            met = ratio <= goal if kind == 'lat' else ratio >= goal
            lines.append(f'| {sv} vs {peer} | {reg} | {statistics.median(a):.3g} | '
                         f'{statistics.median(b):.3g} | {ratio:.2f}x | {"<=" if kind == "lat" else ">="}'
                         f' {goal}x | {"yes" if met else "no"} |')
    lines += ['', f'machine probes: {probes}', f'shared memory per idle QP: {qp_mem} bytes']
    with open(os.path.join(out_dir, 'table.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print('\n'.join(lines))
    failed = [r['case'] for r in results if r['value'] is None]
    if failed:
        print('no number from: ' + ', '.join(sorted(set(failed))), file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
