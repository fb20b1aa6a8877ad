//! A World receive smaller than its message, between real processes under
//! `mpirun`: `short_recv` (rank 0 sends rank 1 one oversized message per
//! size class, inject to rendezvous, each followed by one that fits on the
//! same tag) on shm and with TCP forced. Rank 1 must see `Truncated` with
//! both sizes and every next message intact; a hang or a crash inside
//! libfabric (what 1.17's shm and ofi_rxm did) fails within the deadline.

use crate::support;

use std::time::{Duration, Instant};
use support::{best_tcp, mpirun, wait_all};

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
