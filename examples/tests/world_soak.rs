//! `world_soak`: the World's messages and collectives mixed at random, as
//! a program's phases mix them (receives that name a rank and a tag, a
//! tag alone, nothing; sends before, between or after them; waits by
//! `wait`, `wait_any` or `test`; too-small receives; a non-blocking
//! collective in flight), every message checked for exactly once, whole,
//! and in its sender's order. Four ranks: two per pretend node (node
//! transport beside TCP), all on one node, and TCP alone; and with
//! libfabric's shm as the same-node side, with the receives it keeps in
//! order (`--named-tags`).

use crate::support;

use std::time::{Duration, Instant};
use support::{rendezvous_with_shm, shm_on, wait_all, Exit};

const SOAK: &str = env!("CARGO_BIN_EXE_world_soak");
const DEADLINE: Duration = Duration::from_secs(240);

/// Four ranks of the soak with `FABRIC_MSG_SHM=shm`, `per_node` to a
/// pretend node.
fn run(shm: &str, per_node: Option<u32>, args: &[&str]) -> Vec<Exit> {
    let started = Instant::now();
    wait_all(
        rendezvous_with_shm(SOAK, 4, shm, args, per_node),
        started,
        DEADLINE,
    )
}

fn assert_ok(exits: &[Exit], what: &str) {
    for (r, e) in exits.iter().enumerate() {
        assert!(
            e.status.success() && e.stdout.contains(&format!("rank {r}/4: ok: ")),
            "{what}, rank {r}: {:?}\nstdout:\n{}\nstderr:\n{}",
            e.status,
            e.stdout,
            e.stderr
        );
    }
}

/// Receives from any rank that name a tag, beside later ones that name
/// none, on a World over two nodes: before fabric-msg's node loop asked
/// about such a receive's fabric part (`world/local/claims.rs`), a
/// same-node rank's message could pass an earlier one: on the code before
/// it, seeds 1, 5 and 7 broke the order by rounds 34, 54 and 74 in one run,
/// where seed 3 passed: it depends on timing, hence three seeds.
#[test]
fn random_mixes_over_two_nodes_keep_every_message_and_each_ranks_order() {
    if shm_on() == "libfabric" {
        eprintln!(
            "NOT RUN on libfabric's shm (FABRIC_MSG_TEST_SHM=libfabric): it matches on its own, so a \
             receive from any rank that names a tag can take a rank's message past an earlier one \
             (docs/world.md, \"Receives from any rank\"); \
             named_tags_over_two_nodes_on_libfabrics_shm_keep_every_message_and_each_ranks_order runs \
             what it keeps in order"
        );
        return;
    }
    for seed in ["1", "5", "7"] {
        let exits = run(shm_on(), Some(2), &["-r", "120", "-s", seed]);
        assert_ok(&exits, &format!("two nodes, seed {seed}"));
    }
}

/// All on one node the World runs on the node transport, or, with
/// `FABRIC_MSG_TEST_SHM=libfabric`, on libfabric's shm itself: where that
/// shm has the masked-receive defect (before libfabric 1.19), every rank
/// says it skips instead (docs/world.md, "Known gap"), and so does this
/// test, loudly; on the node transport a skip fails it.
#[test]
fn random_mixes_on_one_node_and_on_tcp_alone_keep_every_message_and_each_ranks_order() {
    let exits = run(shm_on(), None, &["-r", "100", "-s", "2"]);
    let skipped = exits.iter().filter(|e| e.stdout.contains("skipped: ")).count();
    if shm_on() == "libfabric" && skipped == exits.len() && exits.iter().all(|e| e.status.success()) {
        eprintln!(
            "SKIPPED the one-node soak on libfabric's shm (FABRIC_MSG_TEST_SHM=libfabric): {}",
            exits[0]
                .stderr
                .lines()
                .find(|l| l.contains("SKIPPED"))
                .unwrap_or("(no reason given)")
        );
    } else {
        assert_ok(&exits, "one node");
    }
    let exits = run("0", Some(2), &["-r", "100", "-s", "2"]);
    assert_ok(&exits, "TCP alone");
}

/// libfabric's shm as the same-node side (`FABRIC_MSG_SHM=libfabric`, the
/// fall-back where the node transport cannot be used), on a World over
/// two nodes: every receive names a tag (`--named-tags`: from a rank, or
/// from any rank where the plan says any tag), the mix docs/world.md says
/// that side keeps in order. Every size class, too-small receives, waits
/// of every kind and collectives, as above.
#[test]
fn named_tags_over_two_nodes_on_libfabrics_shm_keep_every_message_and_each_ranks_order() {
    for seed in ["1", "5"] {
        let exits = run("libfabric", Some(2), &["-r", "120", "-s", seed, "--named-tags"]);
        assert_ok(&exits, &format!("libfabric's shm, two nodes, seed {seed}"));
        for (r, e) in exits.iter().enumerate() {
            assert!(
                e.stdout.contains("over libfabric's shm (same node)"),
                "rank {r} is not on libfabric's shm:\n{}",
                e.stdout
            );
        }
    }
}
