#!/usr/bin/python3
"""rdma-core's own pyverbs suite (Debian ships it in
/usr/share/doc/rdma-core/tests) run against softverbs.

It runs the generic tests -- every module that is not mlx5- or
EFA-specific -- once with the InfiniBand link layer, once with RoCE, and
once with RoCE and SOFTVERBS_TRANSPORT=udp ("udp": every QP's traffic as
RoCEv2 packets over loopback, the path to other hosts), prints
pass/fail/skip counts and the skip reasons, and fails when:
  - a test fails that expected.txt does not list, with its reason;
  - a test that expected.txt lists now passes (the list must shrink);
  - a non-traffic test of test_device, test_pd, test_mr, test_cq or
    test_addr fails at all;
  - fewer tests pass than --min-pass: a feature that starts answering
    EOPNOTSUPP turns passes into skips, which must not go unnoticed.
The driver runs through `softverbs run`, and librdmacm.so.1 is softverbs'
own, so the rdmacm tests run too (RoCE mode: they need a net interface).
"""
import argparse
import collections
import gzip
import json
import os
import shutil
import subprocess
import sys

SUITE = '/usr/share/doc/rdma-core/tests'
HERE = os.path.dirname(os.path.abspath(__file__))
CORE_MODULES = {'test_device', 'test_pd', 'test_mr', 'test_cq', 'test_addr'}


def prepare(dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(SUITE, dst)
    for name in os.listdir(dst):
        if name.endswith('.gz'):
            path = os.path.join(dst, name)
            with gzip.open(path, 'rb') as src, open(path[:-3], 'wb') as out:
                out.write(src.read())
            os.unlink(path)
    shutil.copy(os.path.join(HERE, 'pyverbs_driver.py'), dst)
    return sorted(n[:-3] for n in os.listdir(dst)
                  if n.startswith('test_') and n.endswith('.py')
                  and 'mlx5' not in n and 'efa' not in n)


def load_expected(link):
    """TEST_ID REASON for every mode, MODE:TEST_ID REASON for one."""
    expected = {}
    with open(os.path.join(HERE, 'expected.txt')) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                test_id, reason = line.split(None, 1)
                mode, _, tid = test_id.rpartition(':')
                if not mode or mode == link:
                    expected[tid] = reason
    return expected


def run(dst, modules, link, build):
    env = dict(os.environ)
    env['LD_LIBRARY_PATH'] = os.path.join(build, 'lib')
    env['SOFTVERBS_LINK_LAYER'] = 'roce' if link == 'udp' else link
    if link == 'udp':
        env['SOFTVERBS_TRANSPORT'] = 'udp'
    else:
        env.pop('SOFTVERBS_TRANSPORT', None)
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    if env.get('SV_ASAN_RT'):
        env['LD_PRELOAD'] = env['SV_ASAN_RT']
        env['ASAN_OPTIONS'] = 'detect_leaks=0:verify_asan_link_order=0'
    # Through `softverbs run`: its view gives the device the
    # /sys/class/infiniband/DEV/device/net/IFNAME link that the rdmacm
    # tests take their address from.
    cmd = [os.path.join(build, 'bin', 'softverbs'), 'run', '--',
           '/usr/bin/python3', os.path.join(dst, 'pyverbs_driver.py')] + modules
    p = subprocess.run(cmd,
                       cwd=dst, env=env, capture_output=True, text=True, timeout=800)
    results = []
    for line in p.stdout.splitlines():
        if line.startswith('{'):
            results.append(json.loads(line))
    if p.returncode != 0 or not results:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit('pyverbs driver failed (rc %d) in %s mode' % (p.returncode, link))
    return results


def reserve_huge_pages():
    """Three tests map 2 MiB huge pages, and --min-pass counts them: as
    tests/integration/perftest.sh does, reserve some where this user may,
    so that the count does not depend on whether another test (perftest's)
    reserved them first."""
    try:
        with open('/proc/meminfo') as f:
            free = next(int(l.split()[1]) for l in f if l.startswith('HugePages_Free:'))
        if free >= 32:
            return
        with open('/proc/sys/vm/nr_hugepages') as f:
            n = int(f.read())
        with open('/proc/sys/vm/nr_hugepages', 'w') as f:
            f.write(str(n + 64))
    except (OSError, StopIteration, ValueError):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', required=True)
    ap.add_argument('--links', default='ib,roce,udp')
    # Per mode: RoCE runs the rdmacm tests too (they need a net
    # interface), InfiniBand skips them; udp passes what RoCE passes.
    ap.add_argument('--min-pass', default='ib=138,roce=160,udp=160')
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    dst = os.path.join(build, 'pyverbs-tests')
    modules = prepare(dst)
    reserve_huge_pages()
    problems = []
    min_pass = dict((k, int(v)) for k, v in (x.split('=') for x in args.min_pass.split(',')))
    passed = {}
    for link in args.links.split(','):
        expected = load_expected(link)
        results = run(dst, modules, link, build)
        passed[link] = set(r['id'] for r in results if r['outcome'] == 'pass')
        counts = collections.Counter(r['outcome'] for r in results)
        skips = collections.Counter(r['detail'] for r in results if r['outcome'] == 'skip')
        print('== pyverbs generic suite, link layer %s: %d tests' % (link, len(results)))
        for r in results:
            tid, out = r['id'].removeprefix('tests.'), r['outcome']
            core = tid.split('.')[0] in CORE_MODULES
            if out in ('fail', 'error'):
                if tid in expected:
                    print('  expected %-5s %s  [%s]' % (out, tid, expected[tid]))
                else:
                    problems.append('%s: %s %s\n%s' % (link, out.upper(), tid, r['detail']))
                if core and not expected.get(tid, '').startswith('data-path'):
                    problems.append('%s: core non-traffic test %s did not pass' % (link, tid))
            elif out == 'pass' and tid in expected:
                problems.append('%s: %s passes now; remove it from expected.txt' % (link, tid))
        print('  skip reasons:')
        for reason, n in skips.most_common():
            print('    %3d  %s' % (n, reason))
        print('  %s: %d passed, %d failed, %d errors, %d skipped' % (
            link, counts['pass'], counts['fail'], counts['error'], counts['skip']))
        if counts['pass'] < min_pass.get(link, 0):
            problems.append('%s: %d passed, fewer than --min-pass %d' % (
                link, counts['pass'], min_pass[link]))
    # The UDP transport is RoCE over packets: it must pass the very tests
    # RoCE over shared memory passes, not merely as many.
    if 'roce' in passed and 'udp' in passed:
        for tid in sorted(passed['roce'] - passed['udp']):
            problems.append('udp: %s passes over shm (roce) but not over udp' % tid)
        for tid in sorted(passed['udp'] - passed['roce']):
            problems.append('roce: %s passes over udp but not over shm (roce)' % tid)
        if passed['roce'] == passed['udp']:
            print('== udp and roce pass the same %d tests' % len(passed['udp']))
    for p in problems:
        print('PROBLEM', p)
    sys.exit(1 if problems else 0)


if __name__ == '__main__':
    main()
