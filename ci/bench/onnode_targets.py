#!/usr/bin/env python3
"""Issue 28's targets judged against a run of ci/bench/onnode.sh.

    ci/bench/onnode_targets.py target/bench/onnode-<time>/

Reads the tables each part wrote (peers-cores.md, peers-none.md,
collectives/results.tsv, dht.md, waits.tsv) and prints one markdown table:
each target, what was measured, met or missed. A part that is missing or
has no number for a target says so instead of a verdict.
"""
import csv
import os
import statistics
import sys


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(s):
    try:
        v = float(s)
    except ValueError:
        return None
    return None if v != v else v  # nan: no run


def peers(path):
    """The node transport's rows of ab.sh's two peers tables:
    {bytes: (ours, fi_pp, ucx, mpi)} and {bytes: (ours, ucx, mpi, /ucx)}."""
    lat, stream, table = {}, {}, None
    if not os.path.exists(path):
        return None, None
    for line in open(path):
        if not line.startswith("|"):
            table = None if not line.strip() else table
            continue
        c = cells(line)
        if "fi_pp" in c:
            table = "lat"
        elif "measure" in c:
            table = "stream"
        elif c[0] == "node" and table == "lat":
            lat[int(c[1])] = tuple(number(x) for x in c[2:6])
        elif c[0] == "node" and table == "stream":
            stream[int(c[1])] = tuple(number(x) for x in (c[3], c[4], c[5], c[6]))
    return lat, stream


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def main(out):
    rows = []

    def row(target, measured, met):
        verdict = "no data" if met is None else ("met" if met else "missed")
        rows.append((target, measured, verdict))

    for pin, label in (("cores", "pinned"), ("none", "unpinned")):
        lat, stream = peers(os.path.join(out, f"peers-{pin}.md"))
        if lat is None:
            row(f"point to point, {label}", f"peers-{pin}.md missing", None)
            continue
        ours, _, _, mpi = lat.get(8, (None,) * 4)
        if ours is None or mpi is None:
            row(f"8 B one-way latency ≤ Open MPI vader's ({label})", "no 8 B row", None)
        else:
            row(f"8 B one-way latency ≤ Open MPI vader's ({label})",
                f"{ours:.2f} µs against {mpi:.2f} ({ours / mpi:.2f}×)", ours <= mpi)
        worst, misses = None, []
        for b in sorted(lat):
            o, *theirs = lat[b]
            theirs = [t for t in theirs if t is not None]
            if o is None or not theirs:
                continue
            r = o / min(theirs)
            worst = r if worst is None else max(worst, r)
            if r > 1:
                misses.append(f"{size(b)} {r:.2f}×")
        if worst is None:
            row(f"every size to 4 MiB ≤ the best of vader, UCX, fi_pingpong ({label})", "no rows", None)
        else:
            sizes = ", ".join(size(b) for b in sorted(lat))
            what = f"sizes {sizes}; " + (f"above the best at {'; '.join(misses)}" if misses
                                          else f"at most {worst:.2f}× the best")
            row(f"every size to 4 MiB ≤ the best of vader, UCX, fi_pingpong ({label})", what, not misses)
        o, ucx, _, _ = stream.get(8, (None,) * 4)
        if o is None or ucx is None:
            row(f"8 B message rate ≥ UCX tag_bw ({label})", "no 8 B stream row", None)
        else:
            row(f"8 B message rate ≥ UCX tag_bw ({label})",
                f"{o:.2f} M/s against {ucx:.2f} ({o / ucx:.2f}×)", o >= ucx)

    tsv = os.path.join(out, "collectives", "results.tsv")
    if os.path.exists(tsv):
        names = {"bcast": "broadcast"}
        got = list(csv.DictReader(open(tsv), delimiter="\t"))
        misses = [f"{r['ranks']} ranks {names.get(r['benchmark'], r['benchmark'])}"
                  f"{' ' + size(int(r['bytes'])) if int(r['bytes']) else ''} {float(r['ratio']):.2f}×"
                  for r in got if float(r["ratio"]) > 1]
        what = (f"{len(got) - len(misses)} of {len(got)} cases at or below Open MPI"
                + (f"; above: {'; '.join(misses)}" if misses else ""))
        row("2- to 8-rank barrier, allreduce (8 B, 64 KiB, 4 MiB), broadcast ≤ Open MPI's time",
            what, (not misses) if got else None)
    else:
        row("2- to 8-rank collectives ≤ Open MPI's time", "collectives/results.tsv missing", None)

    dht = {}
    path = os.path.join(out, "dht.md")
    if os.path.exists(path):
        for line in open(path):
            c = cells(line) if line.startswith("|") else []
            if c and c[0].isdigit():
                dht[int(c[0])] = number(c[4])
    r = dht.get(4)
    row("DHT mix (remote CAS + get), 4 ranks ≤ 1.5× Open MPI osc/sm",
        "no 4-rank row" if r is None else f"{r:.2f}× (2 ranks: {dht.get(2) or float('nan'):.2f}×)",
        None if r is None else r <= 1.5)

    waits = {}
    path = os.path.join(out, "waits.tsv")
    if os.path.exists(path):
        for r in csv.DictReader(open(path), delimiter="\t"):
            v = number(r["value"])
            if v is not None:
                waits.setdefault((r["case"], r["transport"]), []).append(v)
    node, lf = waits.get(("ring", "node")), waits.get(("ring", "libfabric"))
    if node and lf:
        a, b = statistics.median(node), statistics.median(lf)
        row("4 ranks on 2 cores around a ring: no regression against libfabric's shm (within 10 %)",
            f"{a:.1f} µs a round against {b:.1f} ({a / b:.2f}×)", a <= 1.1 * b)
    else:
        row("4 ranks on 2 cores around a ring: no regression", "no runs", None)
    node, lf = waits.get(("block", "node")), waits.get(("block", "libfabric"))
    if node and lf:
        a, b = statistics.median(node), statistics.median(lf)
        row("a rank waiting 5 s with FABRIC_MSG_WAIT=block: the job's CPU no more than on libfabric's shm",
            f"{a:.2f} s of user CPU against {b:.2f}", a <= b)
    else:
        row("a blocking wait's CPU: no regression", "no runs", None)

    print(f"Issue 28's targets, from {out}")
    print()
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for t, m, v in rows:
        print(f"| {t} | {m} | {v} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: onnode_targets.py DIR (a run of ci/bench/onnode.sh)")
    main(sys.argv[1])
