//! A World receive smaller than its message, between real processes under
//! `mpirun`: `short_recv` (rank 0 sends rank 1 one oversized message per
//! size class, inject to rendezvous, each followed by one that fits on the
//! same tag) on shm and with TCP forced. Rank 1 must see `Truncated` with
//! both sizes and every next message intact; a hang or a crash inside
//! libfabric (what 1.17's shm and ofi_rxm did) fails within the deadline.

use crate::support;

use std::time::{Duration, Instant};
use support::{best_tcp, mpirun, rendezvous_with_env, shm_on, wait_all};

const SHORT_RECV: &str = env!("CARGO_BIN_EXE_short_recv");
/// Each launch takes 2-3 s on an idle machine; the bound is for a loaded one.
const DEADLINE: Duration = Duration::from_secs(180);

#[test]
fn a_world_receive_smaller_than_its_message_is_truncated_and_the_next_arrives() {
    for (shm, provider) in [(true, "shm"), (false, best_tcp())] {
        let started = Instant::now();
        let e = wait_all(vec![mpirun(SHORT_RECV, 2, shm, &[])], started, DEADLINE).remove(0);
        assert!(e.status.success(), "{provider}: {e:?}");
        assert!(
            e.stdout.contains(&format!(
                "rank 1/2: 6 truncations reported with both sizes, each next message intact ({provider})"
            )),
            "{provider}: {}",
            e.stdout
        );
        assert!(
            e.stdout.contains("rank 0/2: 6 oversized messages sent"),
            "{}",
            e.stdout
        );
    }
}

/// The same from any rank, across two pretend nodes (the receiver, rank
/// 2, on the other node than the sender, rank 0): with one matching
/// engine (the default) an oversized message of every size class reaches
/// the matcher unmatched, eagerly or announced, and the receive from any
/// rank still sees `Truncated` with both sizes, then the next message
/// whole from rank 0; and the same with the engine off
/// (`FABRIC_MSG_ONE_ENGINE=0`), where the receive waits on both loops;
/// and where one rank asks for the engine and another does not, no rank
/// runs it (the senders would announce to a rank that does not expect it).
#[test]
fn a_receive_from_any_rank_across_nodes_smaller_than_its_message_is_truncated_and_the_next_arrives() {
    if shm_on() == "libfabric" {
        eprintln!("NOT RUN on libfabric's shm (FABRIC_MSG_TEST_SHM=libfabric): one matching engine is the node transport's");
        return;
    }
    // Rank 1 alone says 0 in the last case.
    let split = format!(
        "FABRIC_MSG_ONE_ENGINE=$([ $FABRIC_MSG_RANK = 1 ] && echo 0 || echo 1) exec {SHORT_RECV} --to 2 --any-source"
    );
    for (engine, suffix) in [("1", ", one matching engine)"), ("0", ")"), ("split", ")")] {
        let started = Instant::now();
        let children = if engine == "split" {
            rendezvous_with_env("sh", 4, "1", &["-c", &split], Some(2), &[])
        } else {
            rendezvous_with_env(
                SHORT_RECV,
                4,
                "1",
                &["--to", "2", "--any-source"],
                Some(2),
                &[("FABRIC_MSG_ONE_ENGINE", engine)],
            )
        };
        let exits = wait_all(children, started, DEADLINE);
        for (r, e) in exits.iter().enumerate() {
            assert!(e.status.success(), "engine {engine}, rank {r}: {e:?}");
        }
        let line = format!(
            "rank 2/4: 6 truncations reported with both sizes, each next message intact ({}{suffix}",
            best_tcp()
        );
        assert!(
            exits[2].stdout.contains(&line),
            "engine {engine}: expected {line:?} in {}",
            exits[2].stdout
        );
    }
}
