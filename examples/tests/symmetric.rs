//! The World's symmetric memory between real processes: `symmetric_check`
//! (puts into every rank's part, gets from every rank, fetch-add and
//! compare-swap counters on every rank, every byte checked on the rank
//! that owns it) under `mpirun` at 1, 2, 3 and 5 ranks on shm and
//! tcp;ofi_rxm, with native atomics on shm and emulated ones over TCP, through the
//! rendezvous; and ranks that ask for different lengths or sharings. Where
//! the World maps same-node parts (the node transport,
//! `world/node_symmetric.rs`), every rank says how many it mapped, and the
//! count is checked: all of a node's ranks on the node transport, none on
//! libfabric's shm or off shared memory; with two pretend nodes on TCP, or
//! on `sockets`' native atomics with `NodeSharing::Mapped`, a counter takes
//! CPU atomics from its node and emulated ones from the other at once.
//! Every process has a deadline, so a hang fails the test.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{best_tcp, clean, mpirun, rendezvous, shm_on, wait_all, Exit};

const CHECK: &str = env!("CARGO_BIN_EXE_symmetric_check");
/// Longest any one launch may take (5 ranks on 2 cores under load).
const DEADLINE: Duration = Duration::from_secs(180);

/// The checks one rank of `n` makes: a slot written by every rank, a slot read
/// from every rank, a slot read through the token interface, the refused
/// out-of-bounds write, and with atomics the two counters plus the fetched
/// values of every target, and the counter of the token interface's.
fn expected_checks(n: u32, atomics: bool) -> usize {
    let n = n as usize;
    2 * n + 2 + if atomics { 3 + n } else { 0 }
}

/// Parts each rank of `n` on one node maps: all, on the node transport.
fn mapped_on_one_node(n: u32, shm: bool) -> u32 {
    if shm && shm_on() == "1" && n > 1 {
        n
    } else {
        0
    }
}

fn assert_all_checked(
    out: &str,
    err: &str,
    n: u32,
    provider: &str,
    launcher: &str,
    atomics: bool,
    mapped: u32,
) {
    let want = expected_checks(n, atomics);
    for r in 0..n {
        let line = format!("rank {r}/{n}: {want} checks passed");
        let line = out
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("rank {r}: no `{line}`:\n{out}\n{err}"));
        assert!(
            line.contains(&format!("({provider} via {launcher}; {mapped} parts mapped; ")),
            "{line}"
        );
    }
    assert!(!out.contains("FAILED"), "{out}");
    assert_eq!(err.contains("ATOMICS SKIPPED"), !atomics, "{err}");
}

fn mpirun_checks(shm: bool, args: &[&str], provider: &str, atomics: bool) {
    for n in [1, 2, 3, 5] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(CHECK, n, shm, args)], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{n} ranks on {provider}: {e:?}");
        let mapped = mapped_on_one_node(n, shm);
        assert_all_checked(&e.stdout, &e.stderr, n, provider, "pmix", atomics, mapped);
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
    assert_all_checked(&e.stdout, &e.stderr, 3, best_tcp(), "pmix", false, 0);
}

/// Two pretend nodes of two ranks on TCP, with the node transport: each
/// rank maps its node's two parts, and every counter takes CPU atomics
/// from its own node (requests and direct `NodePart` ones) and fabric-msg's
/// emulated atomics from the other, applied by the same CPU instructions:
/// the counts come out exact.
#[test]
fn mpirun_symmetric_across_pretend_nodes_mixes_cpu_and_emulated_atomics() {
    if node_transport_off() {
        return;
    }
    let e = on_pretend_nodes(&[], &["--atomics", "40"]);
    assert!(e.status.success(), "{e:?}");
    assert_all_checked(&e.stdout, &e.stderr, 4, best_tcp(), "pmix", true, 2);
}

/// The same over libfabric's `sockets` and `shm` providers between the
/// pretend nodes, whose atomics are native: by default the provider
/// carries every operation (no part mapped: the provider's atomics and CPU
/// ones are never mixed); with `NodeSharing::Mapped` each rank maps its
/// node's two parts and the other node's atomics on them are emulated, so
/// a counter takes CPU atomics from its node and emulated ones from the
/// other, and the counts still come out exact. `never` maps nothing on
/// TCP's emulated atomics either.
#[test]
fn mpirun_symmetric_mapped_across_pretend_nodes_over_native_atomics() {
    if node_transport_off() {
        return;
    }
    let sockets = ["-x", "FI_PROVIDER=sockets"];
    let shm = ["-x", "FI_PROVIDER=shm"];
    for (mpi, sharing, provider, mapped) in [
        (&sockets[..], "auto", "sockets", 0),
        (&sockets[..], "mapped", "sockets", 2),
        (&shm[..], "auto", "shm", 0),
        (&shm[..], "mapped", "shm", 2),
        (&[][..], "never", best_tcp(), 0),
    ] {
        let e = on_pretend_nodes(mpi, &["--atomics", "40", "--sharing", sharing]);
        assert!(e.status.success(), "--sharing {sharing}: {e:?}");
        assert_all_checked(&e.stdout, &e.stderr, 4, provider, "pmix", true, mapped);
        // The carrier: over native atomics, the other node's atomics on a
        // mapped part are emulated (applied by its owner's loop), and none
        // are where nothing is mapped.
        if provider != best_tcp() {
            for line in e.stdout.lines().filter(|l| l.contains("checks passed")) {
                let applied = emulated_applied(line);
                assert_eq!(
                    applied > 0,
                    mapped > 0,
                    "--sharing {sharing} on {provider}: {line}"
                );
            }
        }
    }
}

/// The emulated atomics a rank's line says its loop applied.
fn emulated_applied(line: &str) -> u64 {
    line.rsplit("; ")
        .next()
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of emulated atomics: {line}"))
}

/// Whether the node transport is off in this run (said loudly).
fn node_transport_off() -> bool {
    let off = shm_on() != "1";
    if off {
        eprintln!(
            "SKIPPED: the node transport is off (FABRIC_MSG_TEST_SHM={})",
            shm_on()
        );
    }
    off
}

/// `symmetric_check` with `args` on two pretend nodes of two ranks each,
/// the node transport on, `mpi` given to `mpirun` first.
fn on_pretend_nodes(mpi: &[&str], args: &[&str]) -> Exit {
    let mut cmd = Command::new("mpirun");
    clean(&mut cmd)
        .args(["--allow-run-as-root", "--oversubscribe", "-x", "FABRIC_MSG_SHM=1"])
        .args(mpi)
        .args([
            "-np",
            "4",
            "sh",
            "-c",
            &format!(
                "FABRIC_MSG_NODE=node$((OMPI_COMM_WORLD_RANK / 2)) exec {CHECK} {}",
                args.join(" ")
            ),
        ]);
    let child = cmd.spawn().expect("mpirun (ci/setup.sh installs openmpi-bin)");
    wait_all(vec![child], Instant::now(), DEADLINE).remove(0)
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
    assert_all_checked(
        &out,
        &err,
        3,
        "shm",
        "rendezvous",
        true,
        mapped_on_one_node(3, true),
    );
}

/// The last rank asks for 8 bytes more, or for another `NodeSharing`:
/// every rank fails, naming it, and none waits for the others.
#[test]
fn ranks_that_ask_for_different_lengths_or_sharing_all_fail_with_the_reason() {
    let cases = [
        (
            "--mismatch",
            "rank 3 asked for 4104 bytes",
            "rank 0 asked for 4096 bytes",
        ),
        (
            "--mismatch-sharing",
            "rank 3 asked for 4096 bytes with ReadWrite access and NodeSharing::Never",
            "rank 0 asked for 4096 bytes with ReadWrite access and NodeSharing::Auto",
        ),
    ];
    for (shm, (arg, theirs, last)) in [(true, cases[0]), (false, cases[0]), (true, cases[1])] {
        let started = Instant::now();
        let e: Exit = wait_all(vec![mpirun(CHECK, 4, shm, &[arg])], started, DEADLINE).remove(0);
        assert!(!e.status.success(), "{e:?}");
        for r in 0..4 {
            let line = e
                .stderr
                .lines()
                .find(|l| l.starts_with(&format!("symmetric_check: rank {r}: ")))
                .unwrap_or_else(|| panic!("rank {r} said nothing:\n{}", e.stderr));
            assert!(
                line.contains(&format!("failed on rank {r}: "))
                    && (line.contains(theirs) || (r == 3 && line.contains(last))),
                "{arg}: rank {r}: {line}"
            );
            assert!(
                line.contains("every rank must pass the same length, access and sharing"),
                "{line}"
            );
        }
        assert!(e.at < Duration::from_secs(30), "took {:?}", e.at);
    }
}
