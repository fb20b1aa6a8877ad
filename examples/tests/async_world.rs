//! The World's requests awaited in a tokio program (`async_world`, the
//! `tokio` feature's `fabric_msg::world::awaiting`) between real
//! processes: under `mpirun` on the node transport and over TCP, and
//! through the rendezvous. Every rank must report all its checks passed.

use crate::support;

use std::time::{Duration, Instant};
use support::{mpirun, rendezvous, wait_all, Exit};

const TOOL: &str = env!("CARGO_BIN_EXE_async_world");
const DEADLINE: Duration = Duration::from_secs(120);

fn assert_passed(exits: &[Exit], n: u32) {
    let text: String = exits
        .iter()
        .map(|e| format!("{}{}", e.stdout, e.stderr))
        .collect();
    for e in exits {
        assert!(e.status.success(), "async_world failed: {text}");
    }
    for r in 0..n {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("rank {r}/{n}: ")))
            .unwrap_or_else(|| panic!("rank {r} printed nothing:\n{text}"));
        // ring, timeout, the message after it, wait_any's two and both
        // taken, the counter, three persistent starts: at least 9.
        let passed: usize = line
            .split_whitespace()
            .nth(2)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"));
        assert!(passed >= 9 && line.ends_with("checks passed"), "{line}");
    }
    assert!(!text.contains("FAILED"), "{text}");
}

#[test]
fn async_world_under_mpirun_on_the_node_transport() {
    let e = wait_all(vec![mpirun(TOOL, 3, true, &[])], Instant::now(), DEADLINE);
    assert_passed(&e, 3);
}

#[test]
fn async_world_under_mpirun_over_tcp() {
    let e = wait_all(vec![mpirun(TOOL, 3, false, &[])], Instant::now(), DEADLINE);
    assert_passed(&e, 3);
}

#[test]
fn async_world_through_the_rendezvous() {
    let e = wait_all(rendezvous(TOOL, 2, true, &[]), Instant::now(), DEADLINE);
    assert_passed(&e, 2);
}

/// The last of three ranks is killed (`SIGKILL`) while the others await
/// requests one after the other: every one of them — a receive from the
/// dead rank, a receive from a living rank that never sends, a large send
/// to the dead rank, an allreduce — completes with the loss, on the node
/// transport and over TCP, well within the World's bound. The send alone
/// may complete instead, where the provider took it all in before the
/// death (libfabric 2.1's tcp;ofi_rxm); the others may not.
#[test]
fn every_awaited_request_completes_with_the_loss_of_a_killed_rank() {
    for shm in [true, false] {
        let exits = wait_all(
            rendezvous(TOOL, 3, shm, &["--lose-last"]),
            Instant::now(),
            DEADLINE,
        );
        let text: String = exits
            .iter()
            .map(|e| format!("{}{}", e.stdout, e.stderr))
            .collect();
        assert!(
            !exits[2].status.success(),
            "shm {shm}: rank 2 was not killed: {text}"
        );
        for (r, e) in exits.iter().enumerate().take(2) {
            assert!(e.status.success(), "shm {shm}, rank {r}: {text}");
            let line = e
                .stdout
                .lines()
                .find(|l| l.contains("completed with the loss of rank 2"))
                .filter(|l| l.contains(": 4 awaited") || l.contains(": 3 awaited"))
                .unwrap_or_else(|| panic!("shm {shm}, rank {r} said nothing:\n{text}"));
            let secs: f64 = line
                .split(" rank 2 ")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no time in {line:?}"));
            assert!(secs < 12.0, "shm {shm}, rank {r}: {line}");
        }
    }
}

/// `--allreduce`: 4 MiB allreduces on 4 ranks (more than this machine's 2
/// cores, so an awaited wait gives the core away between its polls, as the
/// blocking wait does), awaited and waited for by turns, three rounds;
/// the tool checks every sum and fails on a wrong one.
#[test]
fn awaited_large_allreduces_on_more_ranks_than_cores() {
    let e = wait_all(
        vec![mpirun(TOOL, 4, true, &["--allreduce", "3"])],
        Instant::now(),
        DEADLINE,
    );
    let text = format!("{}{}", e[0].stdout, e[0].stderr);
    assert!(e[0].status.success(), "async_world --allreduce failed: {text}");
    let lines = text.lines().filter(|l| l.contains("ms per allreduce")).count();
    assert_eq!(
        lines, 6,
        "three rounds of awaited and blocking allreduces: {text}"
    );
}

/// `--quiet`: messages that come after 5 ms of quiet, so that an awaited
/// wait has passed its spinning and naps (on the node doorbell's eventfd
/// and the main loop's wait fd, where there are), and by turns waited for
/// with the blocking wait; on the node transport and over TCP, adaptive
/// and with `FABRIC_MSG_WAIT=block`. Every message arrives with its time
/// stamp (the tool checks each), and no nap leaves a wait hanging.
#[test]
fn messages_after_a_quiet_spell_reach_napping_awaited_waits() {
    for shm in [support::shm_on(), "0"] {
        for wait in ["adaptive", "block"] {
            let mut cmd = std::process::Command::new("mpirun");
            support::clean(&mut cmd).args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-x",
                &format!("FABRIC_MSG_SHM={shm}"),
                "-x",
                &format!("FABRIC_MSG_WAIT={wait}"),
                "-np",
                "2",
                TOOL,
                "--quiet",
                "5",
            ]);
            let child = cmd.spawn().expect("mpirun");
            let e = wait_all(vec![child], Instant::now(), DEADLINE);
            let text = format!("{}{}", e[0].stdout, e[0].stderr);
            assert!(
                e[0].status.success(),
                "FABRIC_MSG_SHM={shm} FABRIC_MSG_WAIT={wait}: {text}"
            );
            let lines = text
                .lines()
                .filter(|l| l.contains("from send to receipt"))
                .count();
            assert_eq!(lines, 6, "FABRIC_MSG_SHM={shm} FABRIC_MSG_WAIT={wait}: {text}");
        }
    }
}
