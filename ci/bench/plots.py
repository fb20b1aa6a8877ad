#!/usr/bin/env python3
"""The sweeps behind docs/benchmarks.md's figures, and the figures.

Run through ci/bench/plots.sh, which installs what is missing and builds
the tools first. Two steps:

  sweep  every tool once per point (or --rounds times, median taken), one
         after the other, each under a time limit; raw outputs in OUT/raw/,
         one record per point in OUT/results.json and OUT/results.csv.
  draw   SVG figures from OUT/results.json into FIGURES (matplotlib):
         latency.svg    one-way latency against size, tcp and shm: ours
                        (pingpong, mean, and the p50-p99 band of its
                        iterations), fi_pingpong, UCX (ucx_perftest
                        tag_lat), Open MPI (pingpong_mpi latency)
         bandwidth.svg  streaming bandwidth against size, a window of 64:
                        ours (bandwidth -w 64), UCX (tag_bw), Open MPI
                        (pingpong_mpi rate); fi_pingpong has no streaming
         collectives.svg  world_bench against Open MPI (world_vs_mpi) by
                        rank count: p50 of each call's slowest rank, and
                        the p50-p99 band

Transports: tcp is ours and fi_pingpong on tcp;ofi_rxm (tagged), UCX with
UCX_TLS=tcp,self on lo, Open MPI's ob1 with the tcp BTL on lo; shm is
libfabric's shm, UCX_TLS=posix,self,cma, Open MPI's vader BTL.

  plots.py --out DIR --target TARGET [--quick] [--rounds N] [--figures DIR]
  plots.py --draw-only --out DIR [--figures DIR]
"""
import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time

LIMIT = 120  # seconds any one process may run
WINDOW = 64
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
MPI_BTL = {
    "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"],
    "shm": ["--mca", "pml", "ob1", "--mca", "btl", "vader,self"],
}
# Two ranks unbound, like the other tools' two processes (mpirun binds two
# ranks to a core each by default; ab.sh's PIN=none does the same).
MPI_BIND = ["--bind-to", "none"]
UCX_TLS = {"tcp": "tcp,self", "shm": "posix,self,cma"}
OURS = {"tcp": ["-p", "tcp;ofi_rxm", "-d", "lo"], "shm": ["-p", "shm", "--same-host"]}
FI = {"tcp": ["-p", "tcp;ofi_rxm", "-e", "rdm", "-d", "lo", "-m", "tagged"], "shm": ["-p", "shm", "-e", "rdm", "-m", "tagged"]}


def log(*a):
    print("plots:", *a, file=sys.stderr, flush=True)


def json_lines(text):
    """The JSON objects among a tool's output lines (others skipped)."""
    out = []
    for line in (text or "").splitlines():
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict):
            out.append(v)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether something listens on TCP `port` (from /proc, without connecting)."""
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(f).readlines()[1:]:
                p = line.split()
                if p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port:
                    return True
        except OSError:
            pass
    return False


class Sweep:
    def __init__(self, out, target, quick):
        self.out, self.target, self.quick = out, target, quick
        self.raw = os.path.join(out, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.records = []
        self.runs = 0

    def run(self, name, cmd, env=None):
        """One command to its end under LIMIT; its stdout, or None if it failed."""
        self.runs += 1
        path = os.path.join(self.raw, name)
        with open(path + ".cmd", "w") as f:
            f.write(" ".join(cmd) + "\n")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=env)
        except subprocess.TimeoutExpired:
            log(f"{name}: timed out after {LIMIT} s: {' '.join(cmd)}")
            return None
        open(path + ".out", "w").write(p.stdout)
        open(path + ".err", "w").write(p.stderr)
        if p.returncode != 0:
            log(f"{name}: exit {p.returncode}: {' '.join(cmd)}: {p.stderr.strip()[-300:]}")
            return None
        return p.stdout

    def pair(self, name, server, client, env=None):
        """A server in the background (its output in raw/NAME.server), then
        a client against it on `port` (both given as functions of the
        port); the client's stdout."""
        port = free_port()
        log_file = open(os.path.join(self.raw, name + ".server"), "w")
        s = subprocess.Popen(server(port), stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            for _ in range(200):
                if listening(port) or s.poll() is not None:
                    break
                time.sleep(0.05)
            if not listening(port):
                log(f"{name}: the server never listened on {port}")
                return None
            return self.run(name, client(port), env)
        finally:
            try:
                s.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait()
            log_file.close()

    def record(self, **kv):
        self.records.append(kv)

    def bin(self, name):
        return os.path.join(self.target, "release", name)

    def bench(self, name):
        return os.path.join(self.target, "bench", name)

    # --- latency -------------------------------------------------------
    def iters(self, tr, size):
        n = 5000 if size <= 4096 else 2000 if size <= 65536 else 300
        if tr == "shm" and size <= 65536:
            n *= 4
        return max(n // (5 if self.quick else 1), 100)

    def latency(self, tr, size, rnd):
        n, w = self.iters(tr, size), max(self.iters(tr, size) // 10, 10)
        tag = f"lat-{tr}-{size}-r{rnd}"
        pp = self.bin("pingpong")
        js = self.pair(
            "ours-" + tag,
            lambda p: [pp, *OURS[tr], "-B", str(p)],
            lambda p: [pp, *OURS[tr], "-S", str(size), "-I", str(n), "-W", str(w), "--json", "-P", str(p), "127.0.0.1"],
        )
        lines = json_lines(js)
        if len(lines) == 2:
            head, row = lines
            if head.get("provider") == OURS[tr][1]:
                self.record(kind="latency", transport=tr, impl="ours", bytes=size, round=rnd,
                            us=row["usec_per_xfer"], p50_us=row.get("p50_us"), p99_us=row.get("p99_us"))
            else:
                log(f"{tag}: ours used {head.get('provider')}, not {OURS[tr][1]}: not recorded")
        out = self.pair(
            "fi-" + tag,
            lambda p: ["fi_pingpong", *FI[tr], "-S", str(size), "-I", str(n), "-B", str(p)],
            lambda p: ["fi_pingpong", *FI[tr], "-S", str(size), "-I", str(n), "-P", str(p), "127.0.0.1"],
        )
        rows = [l.split() for l in (out or "").splitlines() if l[:1].isdigit() and len(l.split()) == 8]
        if len(rows) == 1:
            self.record(kind="latency", transport=tr, impl="fi_pingpong", bytes=size, round=rnd, us=float(rows[0][6]))
        ucx = self.ucx(tag, tr, "tag_lat", size, n, w)
        if ucx:
            # typical (50th percentile) and overall (mean) one-way latency
            self.record(kind="latency", transport=tr, impl="ucx", bytes=size, round=rnd, us=ucx[3], p50_us=ucx[1])
        js = self.run("mpi-" + tag, MPIRUN + ["-np", "2", *MPI_BIND, *MPI_BTL[tr], self.bench("pingpong_mpi"),
                                            "latency", "-S", str(size), "-I", str(n), "-W", str(w)])
        lines = json_lines(js)
        if lines and "usec_per_xfer" in lines[-1]:
            self.record(kind="latency", transport=tr, impl="openmpi", bytes=size, round=rnd,
                        us=lines[-1]["usec_per_xfer"])

    def ucx(self, tag, tr, test, size, n, w):
        """ucx_perftest's final row (8 numbers), or None."""
        env = dict(os.environ, UCX_TLS=UCX_TLS[tr], UCX_NET_DEVICES="lo")
        args = ["-t", test, "-s", str(size), "-n", str(n), "-w", str(w), "-f"]
        if test == "tag_bw":
            args += ["-O", str(WINDOW)]
        if self.ucx_mpi_mode:
            args += ["-P", "0"]
        out = self.pair("ucx-" + tag, lambda p: ["ucx_perftest", *args, "-p", str(p)],
                        lambda p: ["ucx_perftest", "127.0.0.1", *args, "-p", str(p)], env)
        rows = [l.split() for l in (out or "").splitlines()]
        rows = [r for r in rows if len(r) == 8 and r[0].isdigit()]
        return [float(x) for x in rows[-1]] if rows else None

    # --- bandwidth -----------------------------------------------------
    def stream_iters(self, tr, size):
        n = 200000 if size <= 64 else 20000 if size <= 4096 else 2000
        if tr == "shm":
            n *= 2
        return max(n // (5 if self.quick else 1), 10 * WINDOW)

    def bandwidth(self, tr, size, rnd):
        n = self.stream_iters(tr, size)
        w = (n // 10 // WINDOW + 1) * WINDOW
        tag = f"bw-{tr}-{size}-r{rnd}"
        bw = self.bin("bandwidth")
        js = self.pair(
            "ours-" + tag,
            lambda p: [bw, *OURS[tr], "-B", str(p)],
            lambda p: [bw, *OURS[tr], "-S", str(size), "-I", str(n), "-W", str(w), "-w", str(WINDOW),
                       "--json", "-P", str(p), "127.0.0.1"],
        )
        lines = json_lines(js)
        if len(lines) == 2:
            head, row = lines
            if head.get("provider") == OURS[tr][1]:
                self.record(kind="bandwidth", transport=tr, impl="ours", bytes=size, round=rnd, mb_per_sec=row["mb_per_sec"])
        ucx = self.ucx(tag, tr, "tag_bw", size, n, w)
        if ucx:
            self.record(kind="bandwidth", transport=tr, impl="ucx", bytes=size, round=rnd, mb_per_sec=ucx[7] * size / 1e6)
        js = self.run("mpi-" + tag, MPIRUN + ["-np", "2", *MPI_BIND, *MPI_BTL[tr], self.bench("pingpong_mpi"), "rate",
                                            "-S", str(size), "-I", str(n), "-W", str(w), "-w", str(WINDOW)])
        lines = json_lines(js)
        if lines and "mb_per_sec" in lines[-1]:
            self.record(kind="bandwidth", transport=tr, impl="openmpi", bytes=size, round=rnd,
                        mb_per_sec=lines[-1]["mb_per_sec"])

    # --- collectives ---------------------------------------------------
    def collectives(self, tr, ranks, case, rnd):
        bench, sizes = case
        iters = ["-I", "300", "-W", "30"] if not self.quick else ["-I", "100", "-W", "10"]
        args = [bench, "-S", sizes] + iters
        tag = f"coll-{tr}-{ranks}-{bench}-r{rnd}"
        shm = "1" if tr == "shm" else "0"
        for impl, cmd in (
            ("ours", MPIRUN + ["-x", f"FABRIC_MSG_SHM={shm}", "-np", str(ranks), self.bin("world_bench"), *args, "--json"]),
            ("openmpi", MPIRUN + [*MPI_BTL[tr], "-np", str(ranks), self.bench("world_vs_mpi"), *args]),
        ):
            out = self.run(f"{impl}-{tag}", cmd)
            for v in json_lines(out):
                if "bytes" in v and "p50_us" in v:
                    self.record(kind="collective", transport=tr, impl=impl, bench=bench, ranks=ranks,
                                bytes=v["bytes"], round=rnd, avg_us=v["avg_us"], p50_us=v["p50_us"],
                                p99_us=v["p99_us"], max_us=v["max_us"])

    def all(self, rounds):
        sizes = [8, 4096, 1 << 20] if self.quick else [8, 64, 512, 4096, 32768, 262144, 1 << 20]
        bw_sizes = [8, 65536, 1 << 20] if self.quick else [8, 512, 4096, 65536, 1 << 20]
        ranks = [2, 4] if self.quick else [2, 4, 8]
        cases = [("barrier", "0"), ("allreduce", "8,65536"), ("bcast", "8,1048576")]
        help_text = subprocess.run(["ucx_perftest", "-h"], capture_output=True, text=True).stdout
        self.ucx_mpi_mode = "-P <0|1>" in help_text
        for rnd in range(1, rounds + 1):
            load = open("/proc/loadavg").read().split()[:3]
            log(f"round {rnd} of {rounds}: load average {' '.join(load)}")
            self.record(kind="load", round=rnd, at="start", load=[float(x) for x in load])
            for tr in ("tcp", "shm"):
                for s in sizes:
                    log(f"latency {tr} {s} B")
                    self.latency(tr, s, rnd)
                for s in bw_sizes:
                    log(f"bandwidth {tr} {s} B")
                    self.bandwidth(tr, s, rnd)
                for n in ranks:
                    for c in cases:
                        log(f"{c[0]} {tr} {n} ranks")
                        self.collectives(tr, n, c, rnd)
        load = open("/proc/loadavg").read().split()[:3]
        self.record(kind="load", round=rounds, at="end", load=[float(x) for x in load])

    def save(self):
        json.dump(self.records, open(os.path.join(self.out, "results.json"), "w"), indent=0)
        keys = sorted({k for r in self.records for k in r})
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            for r in self.records:
                w.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()})


# --- figures -----------------------------------------------------------
LABEL = {"ours": "fabric-msg", "fi_pingpong": "fi_pingpong", "ucx": "UCX", "openmpi": "Open MPI"}
STYLE = {"ours": ("C0", "o"), "fi_pingpong": ("C1", "s"), "ucx": ("C2", "^"), "openmpi": ("C3", "D")}
TRANSPORT = {"tcp": "TCP on lo (ours: tcp;ofi_rxm)", "shm": "shared memory (ours: shm)"}


def median_by(records, key, field):
    """{key(r): median of r[field]} over the rounds."""
    acc = {}
    for r in records:
        if r.get(field) is not None:
            acc.setdefault(key(r), []).append(r[field])
    return {k: statistics.median(v) for k, v in acc.items()}


def size_label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def draw(out, figures):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Text stays text (small files); no date or random ids (stable diffs).
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "fabric-msg", "font.size": 9})
    meta = {"Date": None}
    recs = json.load(open(os.path.join(out, "results.json")))
    loads = [r["load"][0] for r in recs if r["kind"] == "load"]
    note = f"2 shared cores; 1-min load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    os.makedirs(figures, exist_ok=True)
    made = []

    def sizes_axis(ax, xs):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([size_label(x) for x in xs], rotation=30)
        ax.set_xlabel("message size")
        ax.grid(True, which="major", alpha=0.3)

    # latency
    lat = [r for r in recs if r["kind"] == "latency"]
    if lat:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
        for ax, tr in zip(axes, ("tcp", "shm")):
            rs = [r for r in lat if r["transport"] == tr]
            xs = sorted({r["bytes"] for r in rs})
            for impl in ("ours", "fi_pingpong", "ucx", "openmpi"):
                m = median_by([r for r in rs if r["impl"] == impl], lambda r: r["bytes"], "us")
                if not m:
                    continue
                c, mk = STYLE[impl]
                x = sorted(m)
                ax.plot(x, [m[k] for k in x], color=c, marker=mk, label=LABEL[impl] + " (mean)")
                if impl == "ours":
                    p50 = median_by([r for r in rs if r["impl"] == impl], lambda r: r["bytes"], "p50_us")
                    p99 = median_by([r for r in rs if r["impl"] == impl], lambda r: r["bytes"], "p99_us")
                    x = sorted(set(p50) & set(p99))
                    ax.fill_between(x, [p50[k] for k in x], [p99[k] for k in x], color=c, alpha=0.2,
                                    label="fabric-msg p50-p99")
            ax.set_yscale("log")
            sizes_axis(ax, xs)
            ax.set_ylabel("one-way latency (µs)")
            ax.set_title(TRANSPORT[tr])
            ax.legend(fontsize=7)
        fig.suptitle(f"Ping-pong latency, two processes on one host ({note})")
        fig.savefig(os.path.join(figures, "latency.svg"), metadata=meta)
        plt.close(fig)
        made.append("latency.svg")

    # bandwidth
    bw = [r for r in recs if r["kind"] == "bandwidth"]
    if bw:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
        for ax, tr in zip(axes, ("tcp", "shm")):
            rs = [r for r in bw if r["transport"] == tr]
            xs = sorted({r["bytes"] for r in rs})
            for impl in ("ours", "ucx", "openmpi"):
                m = median_by([r for r in rs if r["impl"] == impl], lambda r: r["bytes"], "mb_per_sec")
                if m:
                    c, mk = STYLE[impl]
                    x = sorted(m)
                    ax.plot(x, [m[k] for k in x], color=c, marker=mk, label=LABEL[impl])
            ax.set_yscale("log")
            sizes_axis(ax, xs)
            ax.set_ylabel("MB/s (10^6 B/s), one way")
            ax.set_title(TRANSPORT[tr])
            ax.legend(fontsize=7)
        fig.suptitle(f"Streaming bandwidth, window of {WINDOW} ({note})")
        fig.savefig(os.path.join(figures, "bandwidth.svg"), metadata=meta)
        plt.close(fig)
        made.append("bandwidth.svg")

    # collectives
    co = [r for r in recs if r["kind"] == "collective"]
    if co:
        cases = sorted({(r["bench"], r["bytes"]) for r in co}, key=lambda c: (["barrier", "allreduce", "bcast"].index(c[0]), c[1]))
        fig, axes = plt.subplots(2, len(cases), figsize=(2.6 * len(cases), 5.5), constrained_layout=True, squeeze=False)
        for row, tr in enumerate(("tcp", "shm")):
            for col, (bench, b) in enumerate(cases):
                ax = axes[row][col]
                rs = [r for r in co if r["transport"] == tr and r["bench"] == bench and r["bytes"] == b]
                for impl in ("ours", "openmpi"):
                    sel = [r for r in rs if r["impl"] == impl]
                    p50 = median_by(sel, lambda r: r["ranks"], "p50_us")
                    p99 = median_by(sel, lambda r: r["ranks"], "p99_us")
                    x = sorted(set(p50) & set(p99))
                    if not x:
                        continue
                    c, mk = STYLE[impl]
                    ax.plot(x, [p50[k] for k in x], color=c, marker=mk, label=LABEL[impl] + " p50")
                    ax.fill_between(x, [p50[k] for k in x], [p99[k] for k in x], color=c, alpha=0.2,
                                    label=LABEL[impl] + " p50-p99")
                ax.set_yscale("log")
                ax.set_xticks(sorted({r["ranks"] for r in co}))
                ax.grid(True, alpha=0.3)
                ax.set_title(f"{tr}: {bench}" + ("" if bench == "barrier" else f" {size_label(b)}"), fontsize=8)
                if row == 1:
                    ax.set_xlabel("ranks (mpirun, oversubscribed)")
                if col == 0:
                    ax.set_ylabel("slowest rank per call (µs)")
        axes[0][0].legend(fontsize=6)
        fig.suptitle(f"Collectives against Open MPI: each call's slowest rank ({note})")
        fig.savefig(os.path.join(figures, "collectives.svg"), metadata=meta)
        plt.close(fig)
        made.append("collectives.svg")
    log(f"figures in {figures}: {', '.join(made) or 'none (no results)'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="target")
    ap.add_argument("--figures")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--draw-only", action="store_true")
    a = ap.parse_args()
    figures = a.figures or os.path.join(a.out, "figures")
    if not a.draw_only:
        started = time.time()
        s = Sweep(a.out, a.target, a.quick)
        try:
            s.all(a.rounds)
        finally:
            s.save()
        log(f"{s.runs} runs in {time.time() - started:.0f} s; results in {a.out}/results.json and .csv")
    draw(a.out, figures)


if __name__ == "__main__":
    main()
