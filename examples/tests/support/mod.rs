//! Launching ranks for the integration tests: through `mpirun`, `srun`
//! (`slurm`) or the rendezvous variables, each process with a deadline, its
//! output captured.

#![allow(dead_code)]

pub mod slurm;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How one process ended.
#[derive(Debug)]
pub struct Exit {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// When it ended, from the launch.
    pub at: Duration,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// What `FABRIC_MSG_SHM` says where a test turns shared memory on: `1`
/// (fabric-msg's node transport between same-node ranks, the default), or
/// what `FABRIC_MSG_TEST_SHM` says (`libfabric`), to run the same tests
/// over libfabric's shm: `FABRIC_MSG_TEST_SHM=libfabric cargo test -p
/// fabric-msg-examples`.
pub fn shm_on() -> &'static str {
    match std::env::var("FABRIC_MSG_TEST_SHM").as_deref() {
        Ok("libfabric") => "libfabric",
        Ok("node") | Ok("1") | Ok("") | Err(_) => "1",
        Ok(other) => panic!("FABRIC_MSG_TEST_SHM={other:?}: say libfabric or node"),
    }
}

/// No launcher or provider variables from the test's own environment.
/// A session directory of its own for one `mpirun` (Open MPI's
/// `orte_tmpdir_base`). Open MPI 4.1 keeps every job's session under
/// `/tmp/ompi.<host>.<uid>`, and a job that ends removes that directory
/// when it is empty: one starting at that moment failed with "A call to
/// mkdir was unable to create the desired directory" (CI, 2026-11-28,
/// with the tests' mpiruns running side by side). Short, for the sockets
/// PMIx makes inside it.
fn session_base() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = format!("/tmp/fm-ompi-{}-{n}", std::process::id());
    std::fs::create_dir_all(&dir).expect("a session directory for mpirun");
    dir
}

pub fn clean(cmd: &mut Command) -> &mut Command {
    if cmd.get_program() == "mpirun" {
        cmd.env("OMPI_MCA_orte_tmpdir_base", session_base());
    }
    for v in [
        "FI_PROVIDER",
        "FABRIC_MSG_PROVIDERS",
        "FABRIC_MSG_RANK",
        "FABRIC_MSG_SIZE",
        "FABRIC_MSG_ROOT",
        "FABRIC_MSG_SHM",
        "FABRIC_MSG_NODE",
        "FABRIC_MSG_SINGLE_COPY_FROM",
        ITER_TIMES_ENV,
        "PMIX_RANK",
        "PMIX_NAMESPACE",
    ] {
        cmd.env_remove(v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
}

/// `n` ranks of `program` through the rendezvous, with `FABRIC_MSG_SHM`.
pub fn rendezvous(program: &str, n: u32, shm: bool, args: &[&str]) -> Vec<Child> {
    rendezvous_on_nodes(program, n, shm, args, None)
}

/// [`rendezvous`] with rank `r` on the pretend node `node{r / per_node}`
/// (`FABRIC_MSG_NODE`), where `per_node` is given.
pub fn rendezvous_on_nodes(
    program: &str,
    n: u32,
    shm: bool,
    args: &[&str],
    per_node: Option<u32>,
) -> Vec<Child> {
    rendezvous_with_shm(program, n, if shm { shm_on() } else { "0" }, args, per_node)
}

/// [`rendezvous_on_nodes`] with `FABRIC_MSG_SHM` set to `shm` (`1`, `0` or
/// `libfabric`) whatever `FABRIC_MSG_TEST_SHM` says.
pub fn rendezvous_with_shm(
    program: &str,
    n: u32,
    shm: &str,
    args: &[&str],
    per_node: Option<u32>,
) -> Vec<Child> {
    rendezvous_with_env(program, n, shm, args, per_node, &[])
}

/// [`rendezvous_with_shm`] with `env` set for every rank too.
pub fn rendezvous_with_env(
    program: &str,
    n: u32,
    shm: &str,
    args: &[&str],
    per_node: Option<u32>,
    env: &[(&str, &str)],
) -> Vec<Child> {
    let root = format!("127.0.0.1:{}", free_port());
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(program);
            clean(&mut cmd)
                .args(args)
                .env("FABRIC_MSG_RANK", r.to_string())
                .env("FABRIC_MSG_SIZE", n.to_string())
                .env("FABRIC_MSG_ROOT", &root)
                .env("FABRIC_MSG_SHM", shm)
                .envs(env.iter().copied());
            if let Some(k) = per_node {
                cmd.env("FABRIC_MSG_NODE", format!("node{}", r / k));
            }
            cmd.spawn().expect("starting a rank")
        })
        .collect()
}

/// `mpirun` as root on a 2-core machine, `n` ranks of `program`.
pub fn mpirun(program: &str, n: u32, shm: bool, args: &[&str]) -> Child {
    let mut cmd = Command::new("mpirun");
    let shm = format!("FABRIC_MSG_SHM={}", if shm { shm_on() } else { "0" });
    clean(&mut cmd)
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-x",
            &shm,
            "-np",
            &n.to_string(),
            program,
        ])
        .args(args);
    cmd.spawn().expect("mpirun (ci/setup.sh installs openmpi-bin)")
}

/// Wait for every child, killing all of them after `deadline`.
pub fn wait_all(mut children: Vec<Child>, started: Instant, deadline: Duration) -> Vec<Exit> {
    let pipes: Vec<_> = children
        .iter_mut()
        .map(|c| (drain(c.stdout.take()), drain(c.stderr.take())))
        .collect();
    let mut ends: Vec<Option<(ExitStatus, Duration)>> = children.iter().map(|_| None).collect();
    while ends.iter().any(Option::is_none) {
        for (c, end) in children.iter_mut().zip(ends.iter_mut()) {
            if end.is_none() {
                if let Some(s) = c.try_wait().expect("waiting") {
                    *end = Some((s, started.elapsed()));
                }
            }
        }
        if started.elapsed() > deadline {
            let running: Vec<usize> = (0..ends.len()).filter(|&i| ends[i].is_none()).collect();
            for c in children.iter_mut() {
                // A launcher's own children first: mpirun killed with
                // SIGKILL cannot end its ranks, which would outlive the
                // test (a hung rank keeps spinning).
                for p in children_of(c.id()) {
                    sigkill(p);
                }
                c.kill().ok();
                c.wait().ok();
            }
            let said: Vec<String> = pipes
                .into_iter()
                .enumerate()
                .map(|(i, (o, e))| {
                    let (o, e) = (o.join().unwrap_or_default(), e.join().unwrap_or_default());
                    format!("process {i}: stdout:\n{o}\nstderr:\n{e}")
                })
                .collect();
            panic!(
                "processes {running:?} still running after {deadline:?}: a hang\n{}",
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ends.into_iter()
        .zip(pipes)
        .map(|(end, (o, e))| {
            let (status, at) = end.expect("ended");
            Exit {
                status,
                at,
                stdout: o.join().expect("reader"),
                stderr: e.join().expect("reader"),
            }
        })
        .collect()
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            p.read_to_string(&mut s).ok();
        }
        s
    })
}

/// Processes whose parent is `pid` (mpirun's ranks are its children).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.to_string()))
                .and_then(|rest| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}

/// Whether process `pid` has `var` (`NAME=value`) in its environment.
pub fn environ_has(pid: u32, var: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|&b| b == 0).any(|v| v == var.as_bytes()))
        .unwrap_or(false)
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGKILL `pid`, as a crash would end it.
pub fn sigkill(pid: u32) -> bool {
    // SAFETY: kill(2) with a pid we found; at worst it is gone (ESRCH).
    unsafe { kill(pid as i32, 9) == 0 }
}

/// SIGTERM `pid`, asking it to end.
pub fn sigterm(pid: u32) -> bool {
    // SAFETY: kill(2) with a pid we found; at worst it is gone (ESRCH).
    unsafe { kill(pid as i32, 15) == 0 }
}

/// What a child has printed so far, read line by line as it comes.
#[derive(Debug, Clone, Default)]
pub struct Watch(Arc<Mutex<String>>);

impl Watch {
    /// Start reading `child`'s stdout (which `wait_all` then finds taken).
    pub fn stdout(child: &mut Child) -> Watch {
        let w = Watch::default();
        let (pipe, into) = (child.stdout.take(), w.0.clone());
        std::thread::spawn(move || {
            let Some(pipe) = pipe else { return };
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = into.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        w
    }

    /// Everything read so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wait until `what` has appeared `count` times, at most `limit`.
    pub fn wait_for(&self, what: &str, count: usize, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.text().matches(what).count() >= count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// Remove the shared-memory regions of `pid`, a process that is gone.
/// libfabric 1.17's shm names a rank's region `/dev/shm/<pid>:<n>:<n>` and
/// unlinks it on exit or on a catchable signal, not on SIGKILL; a later
/// process that gets the same pid (pid_max is 32768 here) would then fail
/// to open its endpoint with FI_EBUSY.
pub fn remove_shm_regions(pid: u32) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let prefix = format!("{pid}:");
    for e in dir.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(e.path()).ok();
        }
    }
}

/// `spmd`'s rank 0 printed one verified line per rank and the summary,
/// all on `provider` and naming `launcher`, and every process succeeded.
pub fn assert_verified_ring(exits: &[Exit], n: u32, provider: &str, launcher: &str) {
    for (r, e) in exits.iter().enumerate() {
        assert!(e.status.success(), "process {r} failed: {e:?}");
    }
    let out = &exits[0].stdout;
    for r in 0..n {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("rank {r}/{n}:")))
            .unwrap_or_else(|| panic!("no line for rank {r}: {out}"));
        assert!(
            line.contains("0 bad, 0 out of order: every byte verified"),
            "{line}"
        );
        assert!(line.contains(&format!("({provider} via {launcher})")), "{line}");
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("rank ")).count(),
        n as usize,
        "one line per rank: {out}"
    );
    assert!(
        out.contains(&format!(
            "summary: ring of {n} rank(s) over {provider} ({launcher})"
        )) && out.contains("every byte verified on every rank"),
        "{out}"
    );
}

/// The provider of the first TCP rung this libfabric reaches
/// (providers.toml): tcp's own RDM endpoints from 1.19, `tcp;ofi_rxm` before.
pub fn best_tcp() -> &'static str {
    if fabric_msg::ffi::runtime_version() >= (1, 19) {
        "tcp"
    } else {
        "tcp;ofi_rxm"
    }
}

/// The state letter of `/proc/<pid>/stat` (R, S, D, Z, ...); `None` once
/// the process is reaped.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Processes that have `var` (`NAME=value`) in their environment.
pub fn processes_with(var: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| environ_has(p, var))
        .collect()
}

/// Run one of the tools (`exe`) with `args` to its end, no provider
/// variables from the test's environment, killed after `limit` so a hang
/// fails the test instead of CI.
pub fn run_tool(exe: &str, args: &[&str], limit: Duration) -> std::process::Output {
    let mut child = Command::new(exe)
        .args(args)
        .env_remove("FI_PROVIDER")
        .env_remove("FABRIC_MSG_PROVIDERS")
        .env_remove(ITER_TIMES_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {exe}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("{exe} {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// A `--json` row's distribution: `p50_us`, `p99_us`, `p999_us`, `min_us`
/// and `max_us` present, positive and in order; with `avg` named, that
/// average lies within [min, max] (0.1 %: the histogram's precision).
/// Returns (p50, max).
pub fn assert_tail(row: &serde_json::Value, avg: Option<&str>) -> (f64, f64) {
    let get = |k: &str| {
        row[k]
            .as_f64()
            .unwrap_or_else(|| panic!("no number {k} in {row}"))
    };
    let [min, p50, p99, p999, max] = ["min_us", "p50_us", "p99_us", "p999_us", "max_us"].map(get);
    assert!(min > 0.0, "a positive fastest iteration: {row}");
    assert!(
        min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
        "min <= p50 <= p99 <= p99.9 <= max: {row}"
    );
    if let Some(k) = avg {
        let a = get(k);
        assert!(
            min * 0.999 <= a && a <= max * 1.001,
            "{k} {a} within [{min}, {max}]: {row}"
        );
    }
    (p50, max)
}

/// The variable that turns the tools' per-iteration timing off.
pub const ITER_TIMES_ENV: &str = "FABRIC_MSG_ITER_TIMES";
