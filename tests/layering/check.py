#!/usr/bin/python3
"""The layers' arrows point one way: verbs -> engine -> transports -> core.

Reads the symbols of the library's object files (nm) and lists every call
from a file of one layer to a function defined in a higher layer (a
back-arrow), or in another transport.  The links' upcalls into the packet
engine (engine/engine.h, "What a link calls") are the one allowed way up.
Fails on a back-arrow that tests/layering/known.txt does not list, and on a
listed one that is gone (the list only ever shrinks).  Also fails when an
engine file includes a transport's header, directly or through another
header (the compiler's dependency files, FILE.c.o.d): the engine reaches
the transports only through their ops table (engine/engine.h).

    tests/layering/check.py BUILD_DIR
"""
import os
import subprocess
import sys

RANK = {'core': 0, 'transport': 1, 'engine': 2, 'verbs': 3}
# What a link may call in the engine (engine/engine.h).
UPCALLS = {'sv_pkt_rx_lock', 'sv_pkt_rx', 'sv_pkt_rx_unlock', 'sv_pkt_rx_unlock_poller',
           'sv_pkt_tick', 'sv_pkt_owns',
           'sv_pkt_ep_stats'}
HERE = os.path.dirname(os.path.abspath(__file__))


def layer(rel):
    """('transport/udp', 1) for src/transport/udp/udp.c."""
    parts = rel.split('/')
    if parts[0] == 'transport':
        return 'transport/' + parts[1], RANK['transport']
    return parts[0], RANK.get(parts[0])


def main():
    objdir = os.path.join(sys.argv[1], 'CMakeFiles', 'ibverbs.dir', 'src')
    files = {}
    for root, _, names in os.walk(objdir):
        for n in names:
            if n.endswith('.c.o'):
                path = os.path.join(root, n)
                files[os.path.relpath(path, objdir)[:-2]] = path
    if not files:
        sys.exit('no object files under %s' % objdir)
    defined, undef = {}, {}
    for rel, path in files.items():
        out = subprocess.run(['nm', '-g', path], capture_output=True, text=True,
                             check=True).stdout
        undef[rel] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == 'U':
                undef[rel].add(f[1])
            elif len(f) == 3 and f[1] in 'TDBR':
                defined[f[2]] = rel
    found = set()
    problems_inc = []
    for rel, syms in undef.items():
        lname, lrank = layer(rel)
        if lrank is None:
            continue
        for s in syms:
            if s not in defined:
                continue
            dname, drank = layer(defined[s])
            if drank is None or dname == lname:
                continue
            sideways = lname.startswith('transport/') and dname.startswith('transport/')
            if drank > lrank or sideways:
                if lname.startswith('transport/') and dname == 'engine' and s in UPCALLS:
                    continue
                found.add('%s %s %s' % (rel, s, defined[s]))
    src = os.path.realpath(os.path.join(HERE, '..', '..', 'src'))
    for rel, path in sorted(files.items()):
        if layer(rel)[0] != 'engine':
            continue
        try:
            with open(path + '.d') as f:
                deps = f.read().replace('\\\n', ' ').split()
        except OSError:
            problems_inc.append('%s: no dependency file %s.d' % (rel, path))
            continue
        for d in deps:
            d = os.path.realpath(d) if d.startswith('/') else d
            if d.startswith(os.path.join(src, 'transport') + os.sep):
                problems_inc.append('%s includes %s' % (rel, os.path.relpath(d, src)))
    known = set()
    with open(os.path.join(HERE, 'known.txt')) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                known.add(' '.join(line.split()))
    problems = ['new back-arrow: %s calls %s, defined in %s' % tuple(x.split())
                for x in sorted(found - known)]
    problems += ['gone, remove it from tests/layering/known.txt: %s' % x
                 for x in sorted(known - found)]
    problems += ['an engine file includes a transport header: %s' % x for x in problems_inc]
    print('layering: %d object files, %d back-arrows (%d known)' % (len(files), len(found),
                                                                   len(found & known)))
    for x in sorted(found & known):
        print('  known: %s calls %s (%s)' % tuple(x.split()))
    for p in problems:
        print('PROBLEM', p)
    sys.exit(1 if problems else 0)


if __name__ == '__main__':
    main()
