//! `pingpong` and `bandwidth` as a user runs them: separate processes (libfabric
//! reads FI_PROVIDER once per process), every byte checked, and bad arguments
//! failing fast. Every process runs under a deadline, so a hang fails the test
//! instead of hanging CI.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");
const BANDWIDTH: &str = env!("CARGO_BIN_EXE_bandwidth");
const TOOLS: [&str; 2] = [PINGPONG, BANDWIDTH];
/// Longest any one process may take.
const DEADLINE: Duration = Duration::from_secs(60);

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn command(tool: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(args)
        .env_remove("FI_PROVIDER")
        .env_remove("FABRIC_MSG_PROVIDERS")
        .env_remove(support::ITER_TIMES_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Wait for `child` with a deadline, killing it if it runs over.
fn finish(mut child: Child, started: Instant, what: &str) -> Run {
    // Drain the pipes on threads so a chatty child cannot block on them.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the child") {
            break s;
        }
        if started.elapsed() > DEADLINE {
            child.kill().ok();
            child.wait().ok();
            panic!("{what}: still running after {DEADLINE:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        status,
        stdout: out.join().expect("reader"),
        stderr: err.join().expect("reader"),
        took: started.elapsed(),
    }
}

/// Read a pipe to its end on a thread (empty if the pipe was taken).
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            p.read_to_string(&mut s).ok();
        }
        s
    })
}

fn run(tool: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let started = Instant::now();
    let child = command(tool, args, env).spawn().expect("the tool starts");
    finish(child, started, &format!("{tool} {args:?}"))
}

fn name(tool: &str) -> &str {
    tool.rsplit('/').next().unwrap_or(tool)
}

/// Succeeded, or the test fails showing what the tool said.
fn ok(r: &Run, what: &str) {
    assert!(
        r.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
}

/// The text output: the fabric line and (size, #sent, #ack) of each row.
fn table(r: &Run) -> (String, Vec<(usize, usize, usize)>) {
    let mut lines = r.stdout.lines();
    let fabric = lines.next().unwrap_or_default().to_string();
    let columns = lines.next().unwrap_or_default();
    assert!(
        columns.split_whitespace().eq([
            "bytes",
            "#sent",
            "#ack",
            "total",
            "time",
            "MB/sec",
            "usec/xfer",
            "Mxfers/sec",
            "p50",
            "p99",
            "p99.9",
            "max"
        ]),
        "fabtests' columns, then percentiles: {columns}"
    );
    let rows = lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 12, "row `{l}`");
            let n = |i: usize| f[i].parse::<usize>().unwrap_or_else(|_| panic!("row `{l}`"));
            for x in &f[5..] {
                assert!(x.parse::<f64>().is_ok_and(|v| v >= 0.0), "row `{l}`");
            }
            (n(0), n(1), n(2))
        })
        .collect();
    (fabric, rows)
}

/// The JSON Lines output: the fabric object, then one per size.
fn json(r: &Run) -> (serde_json::Value, Vec<serde_json::Value>) {
    let mut v = r.stdout.lines().map(|l| {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
    });
    let fabric = v.next().expect("a fabric line");
    for k in ["provider", "fabric_kind", "domain", "endpoint_type"] {
        assert!(fabric[k].is_string(), "{k} in {fabric}");
    }
    let rows: Vec<_> = v.collect();
    for row in &rows {
        for k in ["bytes", "iters", "sent", "acked"] {
            assert!(row[k].is_u64(), "{k} in {row}");
        }
        for k in ["usec_per_xfer", "mb_per_sec"] {
            assert!(row[k].as_f64().is_some_and(|x| x >= 0.0), "{k} in {row}");
        }
        assert!(row["usec_per_xfer"].as_f64().unwrap() > 0.0, "{row}");
        // Iterations (pingpong) or windows (bandwidth), per transfer.
        support::assert_tail(row, Some("usec_per_xfer"));
    }
    (fabric, rows)
}

const SIZES: &str = "0,1,64,4097,1048576";
const SIZE_LIST: [usize; 5] = [0, 1, 64, 4097, 1 << 20];

#[test]
fn loopback_tcp_rxm_checks_every_byte_of_every_size() {
    for tool in TOOLS {
        let r = run(
            tool,
            &[
                "--loopback",
                "-p",
                "tcp;ofi_rxm",
                "-d",
                "lo",
                "-S",
                SIZES,
                "-I",
                "6",
                "-W",
                "2",
                "--verify",
            ],
            &[],
        );
        ok(&r, name(tool));
        let (fabric, rows) = table(&r);
        assert!(
            fabric.starts_with("# tcp;ofi_rxm (TCP) domain lo endpoint rdm, tagged"),
            "{fabric}"
        );
        let want: Vec<_> = SIZE_LIST.iter().map(|&s| (s, 6, 6)).collect();
        assert_eq!(rows, want, "{}", r.stdout);
    }
}

#[test]
fn fi_provider_chooses_and_untagged_messages_work() {
    for tool in TOOLS {
        let r = run(
            tool,
            &[
                "--loopback",
                "--msg",
                "-S",
                "8,65536",
                "-I",
                "5",
                "-W",
                "1",
                "--verify",
                "--json",
            ],
            &[("FI_PROVIDER", "tcp")],
        );
        ok(&r, name(tool));
        let (fabric, rows) = json(&r);
        assert_eq!(
            fabric["provider"],
            best_tcp(),
            "FI_PROVIDER=tcp admits tcp and tcp;ofi_rxm"
        );
        assert_eq!(fabric["messages"], "untagged");
        let sizes: Vec<_> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [8, 65536]);
        assert!(
            rows.iter().all(|r| r["iters"] == 5 && r["acked"] == 5),
            "{rows:?}"
        );
    }
}

#[test]
fn connected_tcp_endpoints() {
    for tool in TOOLS {
        let r = run(
            tool,
            &[
                "--loopback",
                "-p",
                "tcp",
                "-e",
                "msg",
                "-S",
                SIZES,
                "-I",
                "5",
                "-W",
                "1",
                "--verify",
                "--json",
            ],
            &[],
        );
        ok(&r, name(tool));
        let (fabric, rows) = json(&r);
        assert_eq!(
            (fabric["provider"].as_str(), fabric["endpoint_type"].as_str()),
            (Some("tcp"), Some("msg"))
        );
        let sizes: Vec<_> = rows
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(sizes, SIZE_LIST);
    }
}

#[test]
fn shared_memory() {
    for tool in TOOLS {
        let r = run(
            tool,
            &[
                "--loopback",
                "-p",
                "shm",
                "--same-host",
                "-S",
                SIZES,
                "-I",
                "6",
                "-W",
                "2",
                "--verify",
            ],
            &[],
        );
        ok(&r, name(tool));
        let (fabric, rows) = table(&r);
        assert!(
            fabric.starts_with("# shm (shared memory) domain shm endpoint rdm"),
            "{fabric}"
        );
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), SIZE_LIST);
    }
}

/// `--stats`: both sides print the loop's counters, and they add up to
/// what the run sent: every message of the ping-pong (warm-up included)
/// went one way and came back, and the client sent its plan too.
#[test]
fn stats_count_every_message_of_the_run() {
    let r = run(
        PINGPONG,
        &[
            "--loopback",
            "-p",
            "tcp;ofi_rxm",
            "-S",
            "64",
            "-I",
            "20",
            "-W",
            "5",
            "--json",
            "--stats",
        ],
        &[],
    );
    ok(&r, "pingpong --stats");
    let objects: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let side = |name: &str| {
        objects
            .iter()
            .find(|v| v["stats"] == name)
            .unwrap_or_else(|| panic!("no {name} stats in {}", r.stdout))
            .clone()
    };
    let (client, server) = (side("client"), side("server"));
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    // 25 messages of 64 B each way, plus the control messages.
    assert!(
        n(&client, "sent_msgs") >= 25 && n(&server, "received_msgs") >= 25,
        "{client}\n{server}"
    );
    assert_eq!(
        n(&client, "sent_msgs"),
        n(&server, "received_msgs"),
        "{client}\n{server}"
    );
    assert_eq!(n(&client, "sent_bytes"), n(&server, "received_bytes"));
    assert_eq!(n(&server, "sent_msgs"), n(&client, "received_msgs"));
    assert_eq!((n(&client, "truncations"), n(&client, "lost_peers")), (0, 0));
}

#[test]
fn blocking_waits_and_a_small_window() {
    let r = run(
        BANDWIDTH,
        &[
            "--loopback",
            "-p",
            "tcp;ofi_rxm",
            "-d",
            "lo",
            "-c",
            "fd",
            "-w",
            "3",
            "-S",
            "1,70000",
            "-I",
            "10",
            "-W",
            "0",
            "--verify",
        ],
        &[],
    );
    ok(&r, "bandwidth -c fd -w 3");
    let (fabric, rows) = table(&r);
    assert!(fabric.contains("wait fd, window 3"), "{fabric}");
    assert_eq!(rows, [(1, 10, 10), (70000, 10, 10)]);
    let r = run(
        PINGPONG,
        &[
            "--loopback",
            "-p",
            "tcp;ofi_rxm",
            "-d",
            "lo",
            "-c",
            "fd",
            "-S",
            "8",
            "-I",
            "20",
            "--verify",
            "--borrowed",
        ],
        &[],
    );
    ok(&r, "pingpong -c fd --borrowed");
    assert_eq!(table(&r).1, [(8, 20, 20)]);
}

/// A server on a port of its choosing (`-B 0`) and the port it printed.
fn server(tool: &str, args: &[&str]) -> (Child, u16, Instant) {
    let (child, port, started, _) = server_keeping_stderr(tool, args);
    (child, port, started)
}

/// [`server`], and the rest of its stderr once it exits.
fn server_keeping_stderr(
    tool: &str,
    args: &[&str],
) -> (Child, u16, Instant, std::thread::JoinHandle<String>) {
    let started = Instant::now();
    let mut all = vec!["-B", "0"];
    all.extend_from_slice(args);
    let mut child = command(tool, &all, &[]).spawn().expect("the server starts");
    let mut err = BufReader::new(child.stderr.take().expect("piped"));
    let mut line = String::new();
    err.read_line(&mut line)
        .expect("the server says where it listens");
    // `bandwidth: server on 0.0.0.0:PORT (...), waiting for a client`
    let port = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("0.0.0.0:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            child.kill().ok();
            panic!("no port in the server's first line: {line}")
        });
    // Keep draining stderr so the server cannot block on it.
    (child, port, started, drain(Some(err)))
}

#[test]
fn a_server_keeps_serving_after_a_port_scan_and_a_garbled_peer() {
    let common = ["-p", "tcp;ofi_rxm", "-d", "lo"];
    let (srv, port, started, stderr) = server_keeping_stderr(PINGPONG, &common);
    // A connect-and-close, then a peer announcing a 4 GiB frame.
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let mut garbled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    garbled.write_all(&[0xff; 64]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let port = port.to_string();
    let mut args = common.to_vec();
    args.extend(["-S", "8", "-I", "4", "-P", &port, "127.0.0.1"]);
    let client = run(PINGPONG, &args, &[]);
    let srv = finish(srv, started, "server");
    ok(&client, "a client after the bad peers");
    ok(&srv, "the server");
    let said = stderr.join().expect("reader");
    assert_eq!(
        said.matches("pingpong: refused 127.0.0.1:").count(),
        2,
        "one line per refused connection: {said}"
    );
    assert!(
        said.contains("connection closed") && said.contains("4294967295 bytes announced"),
        "{said}"
    );
    drop(garbled);
}

#[test]
fn client_and_server_processes() {
    for tool in TOOLS {
        let common = ["-p", "tcp;ofi_rxm", "-d", "lo"];
        let (srv, port, started) = server(tool, &common);
        let port = port.to_string();
        let mut args = common.to_vec();
        args.extend([
            "-S",
            "64,1048576",
            "-I",
            "8",
            "-W",
            "1",
            "--verify",
            "--json",
            "-P",
            &port,
            "127.0.0.1",
        ]);
        let client = run(tool, &args, &[]);
        let srv = finish(srv, started, "server");
        ok(&client, &format!("{} client", name(tool)));
        ok(&srv, &format!("{} server", name(tool)));
        let (fabric, rows) = json(&client);
        assert_eq!(fabric["domain"], "lo");
        assert_eq!(fabric["tool"], name(tool));
        let sizes: Vec<_> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [64, 1 << 20]);
        assert!(
            srv.stdout.is_empty(),
            "the client reports, the server does not: {}",
            srv.stdout
        );
    }
}

#[test]
fn a_server_refuses_a_client_it_cannot_serve() {
    // The wrong tool.
    let (srv, port, started) = server(PINGPONG, &["-p", "tcp;ofi_rxm", "-d", "lo"]);
    let port = port.to_string();
    let client = run(
        BANDWIDTH,
        &[
            "-p",
            "tcp;ofi_rxm",
            "-d",
            "lo",
            "-S",
            "8",
            "-I",
            "4",
            "-P",
            &port,
            "127.0.0.1",
        ],
        &[],
    );
    let srv = finish(srv, started, "server");
    assert_eq!(client.status.code(), Some(1));
    assert_eq!(srv.status.code(), Some(1));
    assert!(
        client
            .stderr
            .contains("the server refused: a bandwidth client cannot use a pingpong server"),
        "{}",
        client.stderr
    );

    // Tagged messages to a server that negotiated without them.
    let (srv, port, started) = server(PINGPONG, &["-p", "tcp;ofi_rxm", "-d", "lo", "--msg"]);
    let port = port.to_string();
    let client = run(
        PINGPONG,
        &[
            "-p",
            "tcp;ofi_rxm",
            "-d",
            "lo",
            "-S",
            "8",
            "-I",
            "4",
            "-P",
            &port,
            "127.0.0.1",
        ],
        &[],
    );
    finish(srv, started, "server");
    assert_eq!(client.status.code(), Some(1));
    assert!(client.stderr.contains("without FI_TAGGED"), "{}", client.stderr);
}

/// Fails with `code` within a few seconds, saying `says`.
fn fails(tool: &str, args: &[&str], code: i32, says: &[&str]) {
    let r = run(tool, args, &[]);
    assert_eq!(
        r.status.code(),
        Some(code),
        "{} {args:?}: {}",
        name(tool),
        r.stderr
    );
    for s in says {
        assert!(
            r.stderr.contains(s),
            "{} {args:?}: expected {s:?} in\n{}",
            name(tool),
            r.stderr
        );
    }
    assert!(
        r.took < Duration::from_secs(15),
        "{} {args:?} took {:?}",
        name(tool),
        r.took
    );
}

#[test]
fn bad_arguments_fail_fast_and_clearly() {
    // A port nobody listens on, held for the whole test: the local end of
    // a connection. A connect to it is refused, and no other test's server
    // can take it meanwhile. (A port bound and let go was taken by a
    // server of a test running beside this one: the tool then met that
    // server's handshake instead of a refusal.)
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let held = TcpStream::connect(holder.local_addr().unwrap()).unwrap();
    let free = held.local_addr().unwrap().port().to_string();
    for tool in TOOLS {
        let n = name(tool);
        // A provider libfabric does not have: no waiting for a peer.
        fails(
            tool,
            &["-p", "nosuch"],
            1,
            &["-p nosuch", "no such provider", "tcp;ofi_rxm"],
        );
        fails(
            tool,
            &["-p", "tcp;ofi_rxm", "-e", "msg", "127.0.0.1"],
            1,
            &["no usable fabric", "\n  "],
        );
        fails(
            tool,
            &["-S", "big"],
            2,
            &["-S big: not a non-negative number", "usage:"],
        );
        fails(tool, &["-I", "0"], 2, &["1 to 1000000000 iterations"]);
        fails(
            tool,
            &["--loopback", "-p", "tcp;ofi_rxm", "-S", "4000000000"],
            1,
            &["more than the 1073741824 allowed"],
        );
        fails(tool, &["--frobnicate"], 2, &["unknown option `--frobnicate`"]);
        fails(tool, &["-c", "sread"], 2, &["-c sread: expected spin or fd"]);
        fails(
            tool,
            &["-p", "tcp;ofi_rxm", "-d", "lo", "-P", &free, "127.0.0.1"],
            1,
            &[
                "connecting to 127.0.0.1:",
                "refused",
                &format!("is a {n} server listening there?"),
            ],
        );
        let help = run(tool, &["-h"], &[]);
        ok(&help, "-h");
        assert!(
            help.stdout.starts_with(&format!("usage: {n} ")),
            "{}",
            help.stdout
        );
    }
}

/// The provider of the first TCP rung this libfabric reaches
/// (providers.toml): tcp's own RDM endpoints from 1.19, `tcp;ofi_rxm` before.
fn best_tcp() -> &'static str {
    if fabric_msg::ffi::runtime_version() >= (1, 19) {
        "tcp"
    } else {
        "tcp;ofi_rxm"
    }
}

/// A client SIGKILLed mid-run: the server says the client is lost, naming
/// it, within a second (the bootstrap's lifeline), not after the 30 s
/// stall watchdog.
#[test]
fn a_server_names_a_killed_client_within_a_second() {
    for provider in ["tcp;ofi_rxm", "shm"] {
        let domain = if provider == "shm" { "shm" } else { "lo" };
        let (mut srv, port, started, said) = server_keeping_stderr(PINGPONG, &["-p", provider, "-d", domain]);
        let port = port.to_string();
        let mut client = command(
            PINGPONG,
            &[
                "-p",
                provider,
                "-d",
                domain,
                "-S",
                "64",
                "-I",
                "100000000",
                "-P",
                &port,
                "127.0.0.1",
            ],
            &[],
        )
        .spawn()
        .expect("the client starts");
        // Its header line: connected, and the server has taken its plan
        // (killed before that, the client is a refused handshake, and the
        // server rightly waits for the next one).
        let mut out = BufReader::new(client.stdout.take().expect("piped"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            out.read_line(&mut first).ok();
            tx.send(first).ok();
            std::io::copy(&mut out, &mut std::io::sink()).ok();
        });
        let header = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the client starts measuring");
        assert!(header.starts_with("# "), "{provider}: {header}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            client.try_wait().unwrap().is_none(),
            "{provider}: the client is still running"
        );
        client.kill().unwrap();
        client.wait().unwrap();
        let killed = Instant::now();
        let status = loop {
            if let Some(s) = srv.try_wait().unwrap() {
                break s;
            }
            assert!(started.elapsed() < DEADLINE, "{provider}: the server hangs");
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = killed.elapsed();
        let said = said.join().unwrap();
        eprintln!("{provider}: server ended {took:?} after the client's SIGKILL");
        assert!(!status.success(), "{provider}: {said}");
        assert!(
            said.contains("is lost") && said.contains("127.0.0.1:"),
            "{provider}: {said}"
        );
        assert!(took < Duration::from_secs(1), "{provider}: {took:?}: {said}");
    }
}

/// `hotpath` (`ci/bench/hotpath.sh` counts its instructions) completes its
/// round trips on shm with injected and sent messages, tagged and not: a
/// tag that did not match, or a send whose buffer never came back, stops it.
#[test]
fn hotpath_round_trips_on_shared_memory() {
    let tool = env!("CARGO_BIN_EXE_hotpath");
    for (size, mode) in [
        ("8", None),
        ("4096", None),
        ("8", Some("--msg")),
        ("65536", Some("--msg")),
    ] {
        let mut args = vec!["-p", "shm", "-S", size, "-I", "2000"];
        args.extend(mode);
        let r = run(tool, &args, &[]);
        ok(&r, "hotpath");
        let tagged = if mode.is_some() { "untagged" } else { "tagged" };
        assert!(
            r.stdout
                .starts_with(&format!("hotpath: 2000 round trips of {size} B ({tagged}, "))
                && r.stdout.contains(" on shm "),
            "{}",
            r.stdout
        );
    }
}
