//! The World's collectives between real processes: `collectives_check`
//! (every collective, element type and op against a sequential reference
//! on each rank, zero-length and uneven contributions included) under
//! `mpirun` at 1, 2, 3, 5 and 8 ranks on shm and tcp;ofi_rxm; a rank killed
//! inside a collective; ranks that pass different lengths, a bad op, bad
//! scatterv counts or alltoallv counts that disagree. On pretend nodes
//! (`FABRIC_MSG_NODE`), the World's blocking allreduce, barrier, reduce
//! and broadcast in two levels (`world/two_level.rs`): the same checks,
//! misuse and a killed leader.
//! Every process has a deadline, so a hang fails the test.

use crate::support;

use std::process::{Child, Command};
use std::time::{Duration, Instant};
use support::{
    best_tcp, children_of, clean, environ_has, mpirun, remove_shm_regions, rendezvous, rendezvous_on_nodes,
    shm_on, sigkill, wait_all, Exit, Watch,
};

const CHECK: &str = env!("CARGO_BIN_EXE_collectives_check");
/// Longest any one launch may take (8 ranks on 2 cores take a few seconds).
const DEADLINE: Duration = Duration::from_secs(120);
/// How soon the survivors of a killed rank must have said so, as in
/// `world.rs`: noticing takes milliseconds; the rest is a loaded machine.
const LOSS_BOUND: Duration = Duration::from_secs(12);
/// How soon every rank must fail when one passes a bad argument or length.
const MISUSE_BOUND: Duration = Duration::from_secs(20);

/// One line per rank, each with the same number of checks (hundreds), on
/// the expected provider.
fn assert_all_checked(out: &str, n: u32, provider: &str, launcher: &str) {
    let mut counts = Vec::new();
    for r in 0..n {
        let prefix = format!("rank {r}/{n}: ");
        let line = out
            .lines()
            .find(|l| l.starts_with(&prefix) && l.contains("checks passed"))
            .unwrap_or_else(|| panic!("no verdict from rank {r}:\n{out}"));
        assert!(line.ends_with(&format!("({provider} via {launcher})")), "{line}");
        let checks: usize = line[prefix.len()..]
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        counts.push(checks);
    }
    assert!(
        counts.iter().all(|&c| c == counts[0] && c >= 500),
        "{counts:?}\n{out}"
    );
    assert!(!out.contains("FAILED"), "{out}");
}

/// How many blocking collectives each rank says went through the node's
/// shared-memory slots.
fn in_slots(out: &str, n: u32) -> Vec<u64> {
    counts(out, n, "collectives in the node's slots")
}

/// Whether processes of one user that are not each other's ancestors may
/// read each other's memory: no Yama, or Yama's `ptrace_scope` 0.
fn may_read_siblings() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").map_or(true, |s| s.trim() == "0")
}

/// Each rank's count on its line `rank r/n: COUNT <what>`.
fn counts(out: &str, n: u32, what: &str) -> Vec<u64> {
    (0..n)
        .map(|r| {
            let prefix = format!("rank {r}/{n}: ");
            out.lines()
                .find(|l| l.starts_with(&prefix) && l.ends_with(what))
                .and_then(|l| l[prefix.len()..].split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("rank {r} did not count its {what}:\n{out}"))
        })
        .collect()
}

fn mpirun_checks(shm: bool, provider: &str) {
    for n in [1, 2, 3, 5, 8] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(CHECK, n, shm, &[])], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{n} ranks on {provider}: {e:?}");
        assert_all_checked(&e.stdout, n, provider, "pmix");
        // A World all on one node over the node transport runs its
        // blocking collectives in the slots, every rank alike; libfabric's
        // shm and TCP never do.
        let slots = in_slots(&e.stdout, n);
        let node = shm && n > 1 && shm_on() != "libfabric";
        assert!(
            slots.iter().all(|&s| s == slots[0] && (s > 0) == node),
            "{n} ranks on {provider}: {slots:?}"
        );
        // Those larger than a slot are read from the others' memory in
        // one copy, where the kernel lets ranks of one user do so (no Yama
        // ptrace_scope of 1 or more here: checked by `may_read_siblings`).
        let copied = counts(&e.stdout, n, "collectives read with one copy");
        assert!(
            copied
                .iter()
                .all(|&c| c == copied[0] && c <= slots[0] && (c > 0) == (node && may_read_siblings())),
            "{n} ranks on {provider}: {copied:?} read with one copy of {slots:?} in the slots"
        );
        // So are the non-blocking and persistent ones (three `i…` calls,
        // one dropped in flight, two starts of a persistent allreduce),
        // where the blocking ones are.
        let nb = counts(&e.stdout, n, "non-blocking calls by one copy");
        let want = if copied[0] > 0 { NB_LARGER } else { 0 };
        assert!(
            nb.iter().all(|&c| c == want),
            "{n} ranks on {provider}: {nb:?} non-blocking calls by one copy, where {want} were due"
        );
    }
}

/// The World's non-blocking and persistent calls larger than a slot in
/// `collectives_check` (`slots.rs`, `non_blocking_in_flight`).
const NB_LARGER: u64 = 6;

/// With the slots turned off the same checks pass as messages alone, so
/// both ways of running a blocking collective on one node stay checked.
#[test]
fn mpirun_checks_every_collective_on_shm_as_messages() {
    for n in [2, 3] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(CHECK, n, true, &["--messages"])], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{n} ranks: {e:?}");
        assert_all_checked(&e.stdout, n, "shm", "pmix");
        assert_eq!(in_slots(&e.stdout, n), vec![0; n as usize]);
    }
}

#[test]
fn mpirun_checks_every_collective_on_shm() {
    mpirun_checks(true, "shm");
}

#[test]
fn mpirun_checks_every_collective_on_tcp() {
    mpirun_checks(false, best_tcp());
}

/// 16 ranks on shm, the short cases and one long broadcast: the world
/// size at which broadcasts scatter and allgather.
#[test]
fn mpirun_checks_sixteen_ranks_on_shm() {
    let started = Instant::now();
    let e = wait_all(
        vec![mpirun(CHECK, 16, true, &["--quick", "--seed", "16"])],
        started,
        DEADLINE,
    )
    .remove(0);
    assert!(e.status.success(), "16 ranks: {e:?}");
    assert_all_checked(&e.stdout, 16, "shm", "pmix");
}

/// The same program through fabric-msg's own launcher (a different seed,
/// the short cases only).
#[test]
fn rendezvous_checks_every_collective() {
    for (n, shm, provider) in [(4, true, "shm"), (3, false, best_tcp())] {
        let started = Instant::now();
        let exits = wait_all(
            rendezvous(CHECK, n, shm, &["--seed", "7", "--quick"]),
            started,
            DEADLINE,
        );
        let out: String = exits.iter().map(|e| e.stdout.as_str()).collect();
        for (r, e) in exits.iter().enumerate() {
            assert!(e.status.success(), "rank {r}: {e:?}");
        }
        assert_all_checked(&out, n, provider, "rendezvous");
    }
}

/// Every survivor names the killed rank, soon after the kill.
fn assert_named(stderr: &[&str], lost: u32, after: &[Duration]) {
    for (s, at) in stderr.iter().zip(after) {
        assert!(
            s.contains(&format!("rank {lost} is lost")),
            "a survivor does not name rank {lost}: {s}"
        );
        assert!(*at < LOSS_BOUND, "a survivor took {at:?} to give up: {s}");
    }
}

/// How long the ranks may take to start looping on a loaded machine.
const START: Duration = Duration::from_secs(60);

/// Ranks allreduce 1 MiB over and over; once every rank has finished one,
/// rank 2 is killed among them.
#[test]
fn a_rank_killed_inside_a_collective_is_named_by_every_other() {
    killed_among(&[true, false], &["--loop", "1048576"]);
}

/// The same among non-blocking allreduces, two in flight: on one node they
/// go by one copy, each rank's vector lent to the others' reads until
/// every rank is done (`queued_copy.rs`), and a survivor whose vector is
/// lent to the dead rank must still give up and name it.
#[test]
fn a_rank_killed_among_non_blocking_collectives_is_named_by_every_other() {
    killed_among(&[true], &["--loop", "1048576", "--call", "iallreduce"]);
}

/// The same on pretend nodes of two, where the non-blocking allreduces
/// run in two levels (`two_level_requests.rs`), small and large: rank 2
/// is node 1's leader, so rank 3 waits in its node's slots for a result
/// its leader never hands down, and ranks 0 and 1 on the leaders' step
/// or their own node's.
#[test]
fn a_leader_killed_among_non_blocking_collectives_in_two_levels_is_named_by_every_other() {
    for size in ["64", "1048576"] {
        killed_on(&[true], &["--loop", size, "--call", "iallreduce"], Some(2));
    }
}

fn killed_among(shms: &[bool], args: &[&str]) {
    killed_on(shms, args, None)
}

fn killed_on(shms: &[bool], args: &[&str], per_node: Option<u32>) {
    for &shm in shms {
        let started = Instant::now();
        let mut children = rendezvous_on_nodes(CHECK, 4, shm, args, per_node);
        let watches: Vec<Watch> = children.iter_mut().map(Watch::stdout).collect();
        if let Some(r) = (0..4).find(|&r| !watches[r].wait_for("looping", 1, START)) {
            let exits = wait_all(children, started, Duration::ZERO);
            panic!("rank {r} never looped; the ranks said: {exits:#?}");
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            children[2].try_wait().expect("rank 2").is_none(),
            "rank 2 ended early"
        );
        let pid2 = children[2].id();
        children[2].kill().expect("SIGKILL rank 2");
        let killed = started.elapsed();
        let exits = wait_all(children, started, DEADLINE);
        remove_shm_regions(pid2);
        let survivors: Vec<&Exit> = [0, 1, 3].iter().map(|&r| &exits[r]).collect();
        for e in &survivors {
            assert!(!e.status.success(), "{e:?}");
        }
        let stderr: Vec<&str> = survivors.iter().map(|e| e.stderr.as_str()).collect();
        let after: Vec<Duration> = survivors.iter().map(|e| e.at.saturating_sub(killed)).collect();
        assert_named(&stderr, 2, &after);
    }
}

/// The same under mpirun: the survivors say which rank was lost before
/// mpirun ends the job.
#[test]
fn mpirun_rank_killed_inside_a_collective_is_named() {
    rank_killed_in_a_loop_of_allreduces(mpirun(CHECK, 4, false, &["--loop", "1048576"]));
}

/// The same on one node, where the allreduces go through the node's
/// shared-memory slots: the survivors wait on a slot the dead rank will
/// never stamp, and must still name it within the bound.
#[test]
fn mpirun_rank_killed_inside_a_slot_collective_is_named() {
    rank_killed_in_a_loop_of_allreduces(mpirun(CHECK, 4, true, &["--loop", "64"]));
}

fn rank_killed_in_a_loop_of_allreduces(mut child: Child) {
    let started = Instant::now();
    let pid = child.id();
    let out = Watch::stdout(&mut child);
    if !out.wait_for("looping", 4, START) {
        let e = wait_all(vec![child], started, Duration::ZERO);
        panic!("the ranks never looped: {:?}; {e:#?}", out.text());
    }
    std::thread::sleep(Duration::from_millis(300));
    let ranks = children_of(pid);
    let rank2 = *ranks
        .iter()
        .find(|&&p| environ_has(p, "PMIX_RANK=2"))
        .unwrap_or_else(|| panic!("no rank 2 among mpirun's children {ranks:?}"));
    assert!(sigkill(rank2), "SIGKILL rank 2");
    let killed = started.elapsed();
    let e = wait_all(vec![child], started, DEADLINE).remove(0);
    remove_shm_regions(rank2);
    assert!(!e.status.success(), "{e:?}");
    for r in [0, 1, 3] {
        let named = said_by(&e, r)
            .is_some_and(|line| line.starts_with(&format!("collectives_check: rank {r}: rank 2 is lost")));
        assert!(named, "rank {r} did not name rank 2: {}", e.stderr);
    }
    assert!(
        e.at.saturating_sub(killed) < LOSS_BOUND,
        "{:?} after the kill",
        e.at - killed
    );
}

/// What rank `r` of a `collectives_check` run said on stderr (its error).
fn said_by(e: &Exit, r: u32) -> Option<&str> {
    let prefix = format!("collectives_check: rank {r}: ");
    e.stderr.lines().find(|l| l.starts_with(&prefix))
}

/// Every rank fails, promptly, with `reason`; none hangs.
fn assert_every_rank_fails(e: &Exit, n: u32, reason: &str) {
    assert!(!e.status.success(), "{e:?}");
    for r in 0..n {
        let line = said_by(e, r).unwrap_or_else(|| panic!("rank {r} said nothing:\n{}", e.stderr));
        assert!(line.contains(reason), "rank {r}: {line}");
    }
    assert!(e.at < MISUSE_BOUND, "took {:?}", e.at);
}

/// The last rank passes one element more to an allreduce: the ranks that
/// receive from it see the length, and every other rank is told.
#[test]
fn ranks_that_pass_different_lengths_all_fail_with_the_reason() {
    for shm in [true, false] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(CHECK, 4, shm, &["--mismatch"])], started, DEADLINE).remove(0);
        assert_every_rank_fails(&e, 4, "every rank must pass matching lengths");
        assert!(
            e.stderr.contains("this rank expected 4000 (1000 × i32)")
                || e.stderr.contains("this rank expected 4004 (1001 × i32)")
                || e.stderr
                    .contains("more than the 4000 bytes this rank expected (1000 × i32)"),
            "{}",
            e.stderr
        );
    }
}

/// The same for the non-blocking allreduce, which on one node posts its
/// header in the node's slots whatever its length (its data too where it
/// fits in a slot, 8 KiB): lengths that differ within a slot, across its
/// edge (2,000 and 2,049 i32) and past it; and a bad op on the last rank,
/// whose refusal goes through the slots. Every rank fails with the
/// reason, none waits for ever, and a barrier after the failed call meets
/// on every rank (each took one number and one slot for it: the tool
/// reports a barrier that failed too). On TCP these are message
/// schedules. The same on a communicator with slots of its own.
#[test]
fn a_non_blocking_allreduce_misused_fails_every_rank_and_the_world_goes_on() {
    for shm in [true, false] {
        for (n, lengths) in [
            (2, "600,601"),
            (3, "2000,2049"),
            (4, "2049,2000"),
            (2, "3000,3001"),
        ] {
            let started = Instant::now();
            let args = ["--mismatch", "--call", "iallreduce", "--lengths", lengths];
            let e = wait_all(vec![mpirun(CHECK, n, shm, &args)], started, DEADLINE).remove(0);
            assert_every_rank_fails(&e, n, "matching lengths");
            assert!(
                !e.stderr.contains("failed too"),
                "{n} ranks, {lengths}, shm {shm}: {}",
                e.stderr
            );
        }
        let started = Instant::now();
        let args = ["--bad-op", "--call", "iallreduce"];
        let e = wait_all(vec![mpirun(CHECK, 4, shm, &args)], started, DEADLINE).remove(0);
        assert_every_rank_fails(
            &e,
            4,
            "BitXor is a bitwise op, for integers only; f64 is a float type",
        );
        assert!(
            !e.stderr.contains("failed too"),
            "bad op, shm {shm}: {}",
            e.stderr
        );
    }
    // On a communicator of the whole World in reverse order, on the node:
    // in the communicator's own slots, across a slot's edge, and a bad op.
    let cases: [(u32, &[&str], &str); 2] = [
        (3, &["--mismatch", "--lengths", "2000,2049"], "matching lengths"),
        (
            4,
            &["--bad-op"],
            "BitXor is a bitwise op, for integers only; f64 is a float type",
        ),
    ];
    for (n, misuse, why) in cases {
        let started = Instant::now();
        let mut args = misuse.to_vec();
        args.extend(["--call", "iallreduce", "--on-comm"]);
        let e = wait_all(vec![mpirun(CHECK, n, true, &args)], started, DEADLINE).remove(0);
        assert_every_rank_fails(&e, n, why);
        assert!(!e.stderr.contains("failed too"), "{args:?}: {}", e.stderr);
    }
}

/// Rank 0 passes one length and every other rank another, each case with
/// the larger vector somewhere a receive is too small for it (the message
/// larger than its receive: on shm and ofi_rxm that once hung or crashed
/// the receiver, docs/decisions.md): at 2 ranks (one element apart, and
/// three times as many), at 4 ranks, and above ofi_rxm's segmented range
/// (rendezvous), on shm beside TCP and on TCP alone. Every rank fails and
/// names the rank whose length differed.
#[test]
fn mismatched_lengths_fail_every_rank_at_every_size() {
    let cases = [
        (2, "600,601"),
        (2, "1000,3000"),
        (4, "1000,3000"),
        (4, "300000,262144"),
    ];
    for shm in [true, false] {
        for (n, lengths) in cases {
            let started = Instant::now();
            let args = ["--mismatch", "--lengths", lengths];
            let e = wait_all(vec![mpirun(CHECK, n, shm, &args)], started, DEADLINE).remove(0);
            assert_every_rank_fails(&e, n, "every rank must pass matching lengths");
            for r in 0..n {
                let line = e
                    .stderr
                    .lines()
                    .find(|l| l.starts_with(&format!("collectives_check: rank {r}: ")))
                    .unwrap_or_else(|| {
                        panic!(
                            "{n} ranks, lengths {lengths}, shm {shm}: rank {r} said nothing:\n{}",
                            e.stderr
                        )
                    });
                assert!(
                    (0..n).any(|k| line.contains(&format!("rank {k} sent "))),
                    "{n} ranks, lengths {lengths}, shm {shm}: rank {r} does not name the rank: {line}"
                );
            }
        }
    }
}

/// The last rank asks for a bitwise allreduce of floats: it is refused
/// there before anything is sent, and every other rank, which needs that
/// rank's vector, is told instead of waiting for it.
#[test]
fn a_bad_argument_on_one_rank_fails_every_rank_with_the_reason() {
    let started = Instant::now();
    let e = wait_all(vec![mpirun(CHECK, 4, true, &["--bad-op"])], started, DEADLINE).remove(0);
    assert_every_rank_fails(
        &e,
        4,
        "BitXor is a bitwise op, for integers only; f64 is a float type",
    );
    assert_eq!(e.stderr.matches("failed on rank 3").count(), 3, "{}", e.stderr);
}

/// The root passes scatterv counts for one rank too few: it is refused
/// there before anything is sent, and every other rank, waiting for its
/// block, is told instead of waiting for ever.
#[test]
fn bad_scatterv_counts_on_the_root_fail_every_rank_with_the_reason() {
    for shm in [true, false] {
        let started = Instant::now();
        let e = wait_all(
            vec![mpirun(CHECK, 4, shm, &["--bad-scatterv"])],
            started,
            DEADLINE,
        )
        .remove(0);
        assert_every_rank_fails(&e, 4, "3 counts for a world of 4 ranks: give one per rank");
        assert_eq!(e.stderr.matches("failed on rank 0").count(), 3, "{}", e.stderr);
    }
}

/// Rank 1 expects one element more from rank 0 than rank 0 sends it in an
/// alltoallv: rank 1's receive sees the length in the first round, names
/// rank 0, and the ranks fail with that reason. At 4 ranks every rank
/// waits, directly or through another, for a later round's message from
/// rank 1, so none can pass; at 3 ranks rank 2 needs nothing rank 1 sends
/// after its first round and may finish with its (correct) blocks.
///
/// Every rank names the reason: a rank still joining when the others
/// failed gets rank 1's notice, because its notice receive is posted
/// before its address is published (`Engine::listen_early`; at the end
/// of `World::init`, 1.17's shm once let that masked receive miss a notice
/// that had arrived first, and the rank waited until the launcher ended it).
#[test]
fn alltoallv_counts_that_disagree_fail_every_rank_with_the_reason() {
    let reason = "rank 0 sent 24 bytes where this rank expected 32 (4 × i64) at step 0 of the alltoall";
    for (n, shm) in [(4, true), (4, false)] {
        let started = Instant::now();
        let e = wait_all(
            vec![mpirun(CHECK, n, shm, &["--alltoallv-mismatch"])],
            started,
            DEADLINE,
        )
        .remove(0);
        assert_every_rank_fails(&e, n, reason);
        assert_eq!(
            e.stderr.matches("failed on rank 1").count(),
            n as usize,
            "{}",
            e.stderr
        );
        assert!(e.at < DEADLINE, "took {:?}", e.at);
    }
}

/// `mpirun` of `n` ranks laid out on pretend nodes: rank r on node
/// `node$((EXPR))`, EXPR over `OMPI_COMM_WORLD_RANK` (the node transport
/// within a node, TCP between nodes).
fn mpirun_on_nodes(n: u32, expr: &str, args: &[&str]) -> Child {
    let mut cmd = Command::new("mpirun");
    clean(&mut cmd).args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-x",
        &format!("FABRIC_MSG_SHM={}", shm_on()),
        "-np",
        &n.to_string(),
        "sh",
        "-c",
        &format!(
            "FABRIC_MSG_NODE=node$(({})) exec {CHECK} {}",
            expr.replace("r", "OMPI_COMM_WORLD_RANK"),
            args.join(" ")
        ),
    ]);
    cmd.spawn().expect("mpirun (ci/setup.sh installs openmpi-bin)")
}

/// Every collective against its reference on pretend nodes: two of two,
/// odd and even ranks apart (a node's ranks not contiguous), and one rank
/// alone beside a node of two. On the node transport the blocking
/// allreduce, barrier, reduce and broadcast of the World and of
/// communicators that span nodes (the World reversed, the World but rank
/// 0) run in two levels, every rank alike; on libfabric's shm
/// (FABRIC_MSG_TEST_SHM=libfabric) as messages.
#[test]
fn mpirun_checks_every_collective_on_pretend_nodes() {
    for (n, nodes) in [(4, "r / 2"), (5, "r % 2"), (3, "r > 0")] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun_on_nodes(n, nodes, &[])], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{n} ranks on nodes {nodes}: {e:?}");
        assert_all_checked(&e.stdout, n, best_tcp(), "pmix");
        let two = counts(&e.stdout, n, "collectives in two levels");
        let on = shm_on() != "libfabric";
        assert!(
            two.iter().all(|&c| c == two[0] && (c > 0) == on),
            "{n} ranks on nodes {nodes}: {two:?}"
        );
        // A communicator of the whole World in reverse order spans the
        // same nodes: its blocking calls go in two levels too.
        let comm = counts(&e.stdout, n, "collectives of a communicator in two levels");
        assert!(
            comm.iter().all(|&c| c == comm[0] && (c > 0) == on),
            "{n} ranks on nodes {nodes}, the reversed communicator: {comm:?}"
        );
        // Their non-blocking and persistent forms too, on the World and
        // on the communicator (`two_level_requests.rs`).
        let requests = counts(&e.stdout, n, "non-blocking collectives in two levels");
        assert!(
            requests.iter().all(|&c| c == requests[0] && (c > 0) == on),
            "{n} ranks on nodes {nodes}, non-blocking: {requests:?}"
        );
    }
}

/// MPI lets ranks start the non-blocking calls of two communicators in
/// different orders. A dup of the World shares its two levels, whose node
/// steps are numbered in the order each rank starts them, so where one
/// exists the non-blocking calls of both go flat; a dup made after the
/// World's non-blocking calls went in two levels makes its own
/// (`comm_handle::Uses`). Both ways, the World's and the dup's
/// `iallreduce`s started in opposite orders on odd and even ranks, and
/// across a World barrier, give every rank the right sums, with every
/// other check (`--dup-first`: the dup before any call; the dup after is
/// in every run of `collectives_check`, as on pretend nodes above).
#[test]
fn a_dup_and_the_world_start_non_blocking_calls_in_any_order_on_pretend_nodes() {
    for (n, nodes) in [(4, "r / 2"), (5, "r % 2")] {
        let started = Instant::now();
        let e = wait_all(
            vec![mpirun_on_nodes(n, nodes, &["--dup-first"])],
            started,
            DEADLINE,
        )
        .remove(0);
        assert!(e.status.success(), "{n} ranks on nodes {nodes}: {e:?}");
        assert_all_checked(&e.stdout, n, best_tcp(), "pmix");
    }
}

/// Misuse on pretend nodes fails every rank with the reason, whichever
/// step of the two levels sees it: a length that differs within a node
/// (its leader sees it in the slots), between nodes (the leaders see it),
/// and a bad op on a node's other rank (refused in the slots). The same
/// on a communicator of the whole World in reverse order, whose own two
/// levels have other leaders and whose misusing rank is world rank 0;
/// there also an allreduce met by barriers.
#[test]
fn misuse_on_pretend_nodes_fails_every_rank_with_the_reason() {
    let order = "every rank must call the same collectives in the same order";
    let cases: [(u32, &str, &[&str], &str); 9] = [
        (
            4,
            "r / 2",
            &["--mismatch", "--on-comm"],
            "every rank must pass matching lengths",
        ),
        (
            4,
            "r / 2",
            &["--bad-op", "--on-comm"],
            "BitXor is a bitwise op, for integers only; f64 is a float type",
        ),
        (
            5,
            "r % 2",
            &["--mismatch", "--call", "barrier", "--on-comm"],
            order,
        ),
        (
            4,
            "r / 2",
            &["--mismatch"],
            "every rank must pass matching lengths",
        ),
        (
            4,
            "r > 0",
            &["--mismatch", "--lengths", "600,601"],
            "every rank must pass matching lengths",
        ),
        (
            4,
            "r / 2",
            &["--bad-op"],
            "BitXor is a bitwise op, for integers only; f64 is a float type",
        ),
        // The non-blocking allreduce, in two levels as a chain of steps
        // (`two_level_requests.rs`): the failure goes down the chain, and
        // the barrier after it meets on every rank.
        (
            4,
            "r / 2",
            &["--mismatch", "--call", "iallreduce", "--on-comm"],
            "every rank must pass matching lengths",
        ),
        (
            4,
            "r > 0",
            &["--mismatch", "--lengths", "600,601", "--call", "iallreduce"],
            "every rank must pass matching lengths",
        ),
        (
            5,
            "r % 2",
            &["--bad-op", "--call", "iallreduce", "--on-comm"],
            "BitXor is a bitwise op, for integers only; f64 is a float type",
        ),
    ];
    for (n, nodes, args, reason) in cases {
        let started = Instant::now();
        let e = wait_all(vec![mpirun_on_nodes(n, nodes, args)], started, DEADLINE).remove(0);
        assert_every_rank_fails(&e, n, reason);
    }
}

/// The last rank calls an allreduce where the others call a barrier, on
/// every path a collective takes: every rank fails, saying that every rank
/// must call the same collectives in the same order, and none waits for
/// ever. In the node's slots the headers differ at once (one node of 2 and
/// of 4 ranks, and two pretend-node layouts, where the node steps of the
/// two levels meet it). As message schedules (TCP, and the node with the
/// slots off) the two collectives post receives for steps the other never
/// sends; after a second of waiting each run tells the ranks it waits for
/// which collective it is in (a probe), and the rank that runs another
/// fails and tells the others.
#[test]
fn a_barrier_met_by_an_allreduce_fails_every_rank_with_the_reason() {
    let reason = "every rank must call the same collectives in the same order";
    let args = ["--mismatch", "--call", "barrier"];
    let messages = ["--mismatch", "--call", "barrier", "--messages"];
    for n in [2, 4] {
        for (shm, args) in [(true, &args[..]), (false, &args[..]), (true, &messages[..])] {
            let started = Instant::now();
            let e = wait_all(vec![mpirun(CHECK, n, shm, args)], started, DEADLINE).remove(0);
            assert_every_rank_fails(&e, n, reason);
        }
    }
    for nodes in ["r > 0", "r / 2"] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun_on_nodes(4, nodes, &args)], started, DEADLINE).remove(0);
        assert_every_rank_fails(&e, 4, reason);
    }
}

/// The last rank starts the non-blocking or the persistent barrier (and
/// waits for it) where the others call the blocking one. MPI forbids it;
/// here the forms meet, and every rank finishes: in the node's slots each
/// takes the same slot number and posts the same header, and as message
/// schedules (TCP) they are the same schedule. Where one rank's call runs
/// in the slots and another's as a message schedule (data larger than a
/// slot on one rank only), every rank fails instead
/// (`a_non_blocking_allreduce_of_mismatched_lengths_fails_every_rank`).
#[test]
fn a_blocking_barrier_meets_a_non_blocking_or_persistent_one() {
    // On a communicator of the whole World in reverse order too, whose
    // calls go through slots of its own on the node.
    for (shm, comm, ranks) in [
        (true, false, &[2, 4][..]),
        (false, false, &[2, 4]),
        (true, true, &[4]),
    ] {
        for call in ["ibarrier", "persistent-barrier"] {
            for &n in ranks {
                let started = Instant::now();
                let mut args = vec!["--mismatch", "--call", call];
                if comm {
                    args.push("--on-comm");
                }
                let e = wait_all(vec![mpirun(CHECK, n, shm, &args)], started, DEADLINE).remove(0);
                assert!(
                    e.status.success(),
                    "{n} ranks, {call}, shm {shm}, on a communicator {comm}: {e:?}"
                );
                if shm && shm_on() != "libfabric" {
                    let in_slots = e
                        .stdout
                        .lines()
                        .filter(|l| l.ends_with(": 1 collectives in the node's slots"))
                        .count();
                    assert_eq!(in_slots, n as usize, "{n} ranks, {call}: {}", e.stdout);
                }
            }
        }
    }
    // On pretend nodes, where the blocking barrier runs in two levels and
    // the non-blocking and persistent ones as the same steps in a chain
    // (`two_level_requests.rs`): they meet as well, on the World and on a
    // communicator with two levels of its own.
    for (n, nodes, comm) in [(4, "r / 2", false), (5, "r % 2", true), (3, "r > 0", false)] {
        for call in ["ibarrier", "persistent-barrier"] {
            let started = Instant::now();
            let mut args = vec!["--mismatch", "--call", call];
            if comm {
                args.push("--on-comm");
            }
            let e = wait_all(vec![mpirun_on_nodes(n, nodes, &args)], started, DEADLINE).remove(0);
            assert!(e.status.success(), "{n} ranks on nodes {nodes}, {call}: {e:?}");
        }
    }
}

/// The last rank computes 3 s before a barrier, an allreduce and a
/// broadcast the others are already in, as message schedules (TCP, and the
/// node with the slots off): the probes the waiting ranks send after a
/// second reach ranks in the same collective or one that has not begun it,
/// and fail nothing; every result is right.
#[test]
fn a_rank_late_to_its_collectives_is_waited_for_and_probed_without_harm() {
    for (shm, extra) in [(false, None), (true, Some("--messages"))] {
        let mut cmd = Command::new("mpirun");
        clean(&mut cmd)
            .args(["--allow-run-as-root", "--oversubscribe", "-x"])
            .arg(format!("FABRIC_MSG_SHM={}", if shm { shm_on() } else { "0" }))
            .args([
                "-x",
                "FABRIC_MSG_LOG=text",
                "-x",
                "FABRIC_MSG_LOG_LEVEL=debug",
                "-np",
                "4",
                CHECK,
            ])
            .args(["--late", "3"])
            .args(extra);
        let started = Instant::now();
        let child = cmd.spawn().expect("mpirun");
        let e = wait_all(vec![child], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{extra:?}: {e:?}");
        for r in 0..4 {
            assert!(
                e.stdout.contains(&format!("rank {r}/4: 3 checks passed")),
                "{extra:?}, rank {r}:\n{}",
                e.stdout
            );
        }
        assert!(
            e.stderr.contains("has waited 1s for ranks")
                && e.stderr.contains("telling them which collective"),
            "{extra:?}: no probe was sent while rank 3 computed:\n{}",
            e.stderr
        );
    }
}

/// A reduce and a broadcast misused on pretend nodes, where they run in
/// two levels: the ranks whose result the misuse reaches fail with the
/// reason (for a reduce, the node that misused and, past it, the root's;
/// for a broadcast, the rank that expects another length), the others
/// finish or fail with it, and none waits for ever. A reduce's root is the
/// last rank, a node's other rank in both layouts. On libfabric's shm
/// (flat schedules) the misusing rank, the last, is the one sure to fail.
/// The non-blocking reduce the same, with a barrier after it that meets
/// on every rank: the misusing rank still takes its node's steps.
#[test]
fn reduce_and_broadcast_misuse_on_pretend_nodes_fails_where_it_reaches() {
    let lengths = "every rank must pass matching lengths";
    let bad_op = "BitXor is a bitwise op, for integers only; f64 is a float type";
    // Ranks, layout, arguments, the ranks that must fail, the reason.
    type Case<'a> = (u32, &'a str, &'a [&'a str], &'a [u32], &'a str);
    let cases: [Case; 8] = [
        (4, "r / 2", &["--mismatch", "--call", "reduce"], &[2, 3], lengths),
        (4, "r / 2", &["--bad-op", "--call", "reduce"], &[2, 3], bad_op),
        (
            5,
            "r % 2",
            &["--mismatch", "--call", "reduce"],
            &[0, 2, 4],
            lengths,
        ),
        (4, "r / 2", &["--mismatch", "--call", "broadcast"], &[3], lengths),
        (4, "r > 0", &["--mismatch", "--call", "broadcast"], &[3], lengths),
        (4, "r / 2", &["--bad-op", "--call", "ireduce"], &[2, 3], bad_op),
        (4, "r / 2", &["--mismatch", "--call", "ireduce"], &[2, 3], lengths),
        (5, "r % 2", &["--bad-op", "--call", "ireduce"], &[0, 2, 4], bad_op),
    ];
    for (n, nodes, args, failing, reason) in cases {
        let last = [n - 1];
        let failing = if shm_on() == "libfabric" {
            &last[..]
        } else {
            failing
        };
        let started = Instant::now();
        let e = wait_all(vec![mpirun_on_nodes(n, nodes, args)], started, DEADLINE).remove(0);
        assert!(!e.status.success(), "{args:?} on nodes {nodes}: {e:?}");
        assert!(
            !e.stderr.contains("the barrier after the failed"),
            "{args:?} on nodes {nodes}: {e:?}"
        );
        for r in 0..n {
            let said = said_by(&e, r);
            let finished = e.stdout.contains(&format!("rank {r}/{n}: 0 checks passed"));
            match said {
                Some(line) => assert!(line.contains(reason), "{args:?}, rank {r}: {line}"),
                None => assert!(
                    finished && !failing.contains(&r),
                    "{args:?} on nodes {nodes}: rank {r} neither failed nor finished:\n{e:?}"
                ),
            }
        }
        assert!(e.at < MISUSE_BOUND, "took {:?}", e.at);
    }
}

/// A node's leader killed in a loop of two-level allreduces: the other
/// rank of its node (waiting in the slots), the other leader (waiting on
/// the fabric) and that leader's node (waiting for its leader) all name it.
#[test]
fn mpirun_leader_killed_inside_a_two_level_collective_is_named() {
    rank_killed_in_a_loop_of_allreduces(mpirun_on_nodes(4, "r / 2", &["--loop", "64"]));
}

/// The same in a communicator's own two levels (the World in reverse
/// order, whose leaders are world ranks 3 and 1): rank 2 is a node's
/// other rank there, posting to its leader in the slots, and every other
/// rank still names it as lost (`Error::RankLost`). Rank 1, the other
/// leader, can hear that leader's refusal naming the loss before its own
/// lifeline reports it (seen in one CI run of four on 2026-11-29): it
/// waits for its own word on the loss (`World::settled`).
#[test]
fn mpirun_rank_killed_inside_a_communicators_two_levels_is_named() {
    rank_killed_in_a_loop_of_allreduces(mpirun_on_nodes(4, "r / 2", &["--loop", "64", "--on-comm"]));
}
