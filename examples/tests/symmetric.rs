//! The World's symmetric memory between real processes: `symmetric_check`
//! (puts into every rank's part, gets from every rank, fetch-add and
//! compare-swap counters on every rank, every byte checked on the rank
//! that owns it) under `mpirun` at 1, 2, 3 and 5 ranks on shm and
//! tcp;ofi_rxm, with native atomics on shm and emulated ones over TCP, through the
//! rendezvous; and ranks that ask for different lengths.
//! Every process has a deadline, so a hang fails the test.

mod support;

use std::time::{Duration, Instant};
use support::{best_tcp, mpirun, rendezvous, wait_all, Exit};

const CHECK: &str = env!("CARGO_BIN_EXE_symmetric_check");
/// Longest any one launch may take (5 ranks on 2 cores under load).
const DEADLINE: Duration = Duration::from_secs(180);

/// The checks one rank of `n` makes: a slot written by every rank, a slot read
/// from every rank, the refused out-of-bounds write, and with atomics the
/// two counters plus the fetched values of every target.
fn expected_checks(n: u32, atomics: bool) -> usize {
    let n = n as usize;
    2 * n + 1 + if atomics { 2 + n } else { 0 }
}

fn assert_all_checked(out: &str, err: &str, n: u32, provider: &str, launcher: &str, atomics: bool) {
    let want = expected_checks(n, atomics);
    for r in 0..n {
        let line = format!("rank {r}/{n}: {want} checks passed");
        let line = out
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("rank {r}: no `{line}`:\n{out}\n{err}"));
        assert!(line.ends_with(&format!("({provider} via {launcher})")), "{line}");
    }
    assert!(!out.contains("FAILED"), "{out}");
    assert_eq!(err.contains("ATOMICS SKIPPED"), !atomics, "{err}");
}

fn mpirun_checks(shm: bool, args: &[&str], provider: &str, atomics: bool) {
    for n in [1, 2, 3, 5] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(CHECK, n, shm, args)], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{n} ranks on {provider}: {e:?}");
        assert_all_checked(&e.stdout, &e.stderr, n, provider, "pmix", atomics);
    }
}

/// Native atomics (shm validates them all).
#[test]
fn mpirun_symmetric_write_read_and_atomics_on_shm() {
    mpirun_checks(true, &[], "shm", true);
}

/// The best TCP rung (tcp;ofi_rxm on 1.17, tcp's own RDM from 1.19)
/// validates no atomics: the World's default asks for them, so fabric-msg
/// emulates them (the ladder's choice stays).
#[test]
fn mpirun_symmetric_write_read_and_emulated_atomics_on_tcp() {
    mpirun_checks(false, &["--atomics", "20"], best_tcp(), true);
}

/// Without Capability::Atomic: puts and gets, atomics skipped loudly.
#[test]
fn mpirun_symmetric_without_atomics() {
    let started = Instant::now();
    let e = wait_all(
        vec![mpirun(CHECK, 3, false, &["--no-atomics"])],
        started,
        DEADLINE,
    )
    .remove(0);
    assert!(e.status.success(), "{e:?}");
    assert_all_checked(&e.stdout, &e.stderr, 3, best_tcp(), "pmix", false);
}

#[test]
fn rendezvous_symmetric_memory() {
    let started = Instant::now();
    let exits = wait_all(rendezvous(CHECK, 3, true, &[]), started, DEADLINE);
    let out: String = exits.iter().map(|e| e.stdout.as_str()).collect();
    let err: String = exits.iter().map(|e| e.stderr.as_str()).collect();
    for (r, e) in exits.iter().enumerate() {
        assert!(e.status.success(), "rank {r}: {e:?}");
    }
    assert_all_checked(&out, &err, 3, "shm", "rendezvous", true);
}

/// The last rank asks for 8 bytes more: every rank fails, naming it, and
/// none waits for the others.
#[test]
fn ranks_that_ask_for_different_lengths_all_fail_with_the_reason() {
    for shm in [true, false] {
        let started = Instant::now();
        let e: Exit = wait_all(vec![mpirun(CHECK, 4, shm, &["--mismatch"])], started, DEADLINE).remove(0);
        assert!(!e.status.success(), "{e:?}");
        for r in 0..4 {
            let line = e
                .stderr
                .lines()
                .find(|l| l.starts_with(&format!("symmetric_check: rank {r}: ")))
                .unwrap_or_else(|| panic!("rank {r} said nothing:\n{}", e.stderr));
            assert!(
                line.contains(&format!("failed on rank {r}: "))
                    && (line.contains("rank 3 asked for 4104 bytes")
                        || (r == 3 && line.contains("rank 0 asked for 4096 bytes"))),
                "rank {r}: {line}"
            );
            assert!(
                line.contains("every rank must pass the same length and access"),
                "{line}"
            );
        }
        assert!(e.at < Duration::from_secs(30), "took {:?}", e.at);
    }
}
