//! What a World waits for (issue 25), with real ranks under `mpirun`: a
//! peer that computes 20 s before it receives, 2000 sends of 64 KiB posted
//! before their receives, more ranks than cores, and a one-sided read from
//! a rank that computes. On shm, on TCP (`tcp;ofi_rxm`, and `tcp`'s own RDM
//! endpoints where libfabric has them, 1.19 on). The `waits` program checks
//! every byte; these tests check that every case completes, on which
//! fabric, and within bounds far from the margins (seconds). The cases of
//! one test run side by side (one `mpirun` each) to keep CI time down.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{clean, wait_all, Exit};

const WAITS: &str = env!("CARGO_BIN_EXE_waits");
/// Longest any one launch may take: the cases compute at most 20 s.
const DEADLINE: Duration = Duration::from_secs(120);

/// A fabric the World is made to choose: its provider, what carries its
/// same-node messages, and the variables that make the ranks choose them.
struct Fabric {
    provider: &'static str,
    name: &'static str,
    env: Vec<String>,
}

/// A ladder of one rung, `tcp;ofi_rxm`: so that libfabric 1.19 and later,
/// whose ladder prefers `tcp`'s own RDM endpoints, are tested on rxm too.
fn rxm_ladder() -> PathBuf {
    let path = std::env::temp_dir().join(format!("fabric-msg-waits-rxm-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "version = 1\n[[rung]]\nkind = \"tcp\"\nprovider = \"tcp;ofi_rxm\"\nendpoint = \"rdm\"\n",
    )
    .expect("writing a ladder");
    path
}

/// shm (messages over fabric-msg's node transport, the default, and over
/// libfabric's shm), `tcp;ofi_rxm` and, from libfabric 1.19, `tcp`.
fn fabrics() -> Vec<Fabric> {
    let mut all = vec![
        Fabric {
            provider: "shm",
            name: "shm with the node transport",
            env: vec!["FABRIC_MSG_SHM=node".into()],
        },
        Fabric {
            provider: "shm",
            name: "shm alone (FABRIC_MSG_SHM=libfabric)",
            env: vec!["FABRIC_MSG_SHM=libfabric".into()],
        },
        Fabric {
            provider: "tcp;ofi_rxm",
            name: "tcp;ofi_rxm",
            env: vec![
                "FABRIC_MSG_SHM=0".into(),
                format!("FABRIC_MSG_PROVIDERS={}", rxm_ladder().display()),
            ],
        },
    ];
    if fabric_msg::ffi::runtime_version() >= (1, 19) {
        all.push(Fabric {
            provider: "tcp",
            name: "tcp",
            env: vec!["FABRIC_MSG_SHM=0".into()],
        });
    }
    all
}

/// `mpirun -np n waits ARGS` on `fabric`, started now.
fn launch(fabric: &Fabric, n: u32, args: &[&str]) -> std::process::Child {
    let mut cmd = Command::new("mpirun");
    clean(&mut cmd).args(["--allow-run-as-root", "--oversubscribe"]);
    for e in &fabric.env {
        cmd.args(["-x", e]);
    }
    cmd.args(["-np", &n.to_string(), WAITS]).args(args);
    cmd.spawn().expect("mpirun (ci/setup.sh installs openmpi-bin)")
}

/// Run `args` on every fabric at once, `n` ranks each; each exit, checked
/// to have succeeded on its fabric.
fn on_every_fabric(n: u32, args: &[&str]) -> Vec<(&'static str, Exit)> {
    let fabrics = fabrics();
    let started = Instant::now();
    let children = fabrics.iter().map(|f| launch(f, n, args)).collect();
    let exits = wait_all(children, started, DEADLINE);
    fabrics
        .iter()
        .zip(exits)
        .map(|(f, e)| {
            assert!(
                e.status.success(),
                "{} on {}: {}\nstdout:\n{}\nstderr:\n{}",
                args.join(" "),
                f.name,
                e.status,
                e.stdout,
                e.stderr
            );
            let tail = format!("[{}]", f.provider);
            assert!(
                e.stdout.lines().any(|l| l.ends_with(&tail)),
                "{} ran on another fabric than {}:\n{}",
                args.join(" "),
                f.provider,
                e.stdout
            );
            eprintln!("{}: {}", f.name, e.stdout.trim());
            (f.name, e)
        })
        .collect()
}

/// The number after `word` in `line`.
fn number_after(line: &str, word: &str) -> f64 {
    let rest = &line[line.find(word).unwrap_or_else(|| panic!("{word:?} in {line:?}")) + word.len()..];
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse()
        .unwrap_or_else(|_| panic!("a number after {word:?} in {line:?}"))
}

/// Rank 1 receives one 1 KiB message posted before 20 s of computation (on
/// the CPU, not calling the library) and one posted after; rank 0 sent
/// both first and waits for rank 1's answer. At main (issue 25) the send
/// failed after 5 s ("refused for lack of room (FI_EAGAIN) for 5.01s") and
/// the job died. Now both messages arrive and the answer comes once rank 1
/// is done computing: a peer that computes is not a failure.
#[test]
fn a_peer_that_computes_20_s_before_it_receives_is_waited_for() {
    for (provider, e) in on_every_fabric(2, &["peer", "--compute", "20", "--spin"]) {
        let after = number_after(&e.stdout, "its answer came after");
        assert!(
            (19.0..60.0).contains(&after),
            "{provider}: answer after {after} s of a 20 s computation"
        );
    }
}

/// 2000 sends of 64 KiB posted at once, their receives posted 3 s later:
/// every message arrives, in order, intact (at main the sends stalled 5 s
/// and failed, FI_ENOMEM on the receive side). Then 4 ranks on this
/// 2-core machine exchange 2000 rounds around a ring, each waited for with
/// `World::poll(None)`: all complete, every byte checked.
#[test]
fn early_sends_wait_for_their_receives_and_oversubscribed_ranks_finish() {
    for (provider, e) in on_every_fabric(2, &["flood", "-n", "2000", "-S", "65536", "--hold", "3"]) {
        assert!(
            e.stdout.contains("all delivered, in order"),
            "{provider}: {}",
            e.stdout
        );
    }
    for (provider, e) in on_every_fabric(4, &["ring", "-n", "2000", "-S", "256"]) {
        assert!(
            e.stdout.contains("4 ranks, 2000 rounds"),
            "{provider}: {}",
            e.stdout
        );
    }
}

/// Rank 0 reads rank 1's symmetric memory 50 times while rank 1 computes
/// for 10 s without calling the library: the World's progress thread
/// (started by default where the fabric needs the target's CPU) serves
/// them, so every read completes long before the target would poll again
/// (at main a read from a computing rank took 3.1 s on TCP, and for ever
/// if it never polled).
#[test]
fn a_read_from_a_rank_that_computes_completes_before_it_polls_again() {
    for (provider, e) in on_every_fabric(2, &["get", "--compute", "10", "-I", "50", "--spin"]) {
        let within = number_after(&e.stdout, "all within");
        assert!(
            within < 5.0,
            "{provider}: 50 reads took {within} s while the target computed 10 s: they waited for it"
        );
    }
}
