//! What fabric-msg works around on a provider, as data of its
//! [`Profile`](super::profile::Profile) rather than provider names compared
//! inside the loop. Each flag names the defect, the libfabric versions it
//! was seen in, and where the workaround lives; docs/decisions.md tells
//! each story in full.

use serde::{Deserialize, Serialize};

/// A provider's known defects that change how the loop behaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quirks {
    /// A message larger than its receive crashes or hangs the receiver
    /// instead of completing truncated (1.17's `tcp;ofi_rxm` segmented
    /// range, `shm` above its inject size, `udp;ofi_rxd`): receives take
    /// the overflow sink behind the buffer where they can
    /// (`transport/event_loop/overflow.rs`).
    pub cuts_oversized_badly: bool,
    /// `ofi_rxm` over verbs reposts a flow-control credit that arrived
    /// after the last poll on the connection it has just closed (SIGSEGV in
    /// `rxm_close_conn`, 1.17 and 2.1): the loop reads its CQ for a moment
    /// before closing (`teardown.rs`, `settle_rxm`).
    pub reposts_credits_on_close: bool,
    /// `ofi_rxm` cannot close a connection on which a segmented message is
    /// half received (1.17 to 1.22 spin for ever, 2.0 to 2.6 crash): after
    /// a peer was lost the loop leaves its endpoints open instead of
    /// closing them (`teardown.rs`, `rxm_left_open`).
    pub close_hangs_after_loss: bool,
}

impl Quirks {
    /// The workarounds `provider` (a `core;utility` name) needs.
    pub fn of(provider: &str) -> Quirks {
        Quirks {
            cuts_oversized_badly: matches!(provider, "tcp;ofi_rxm" | "shm" | "udp;ofi_rxd"),
            reposts_credits_on_close: provider == "verbs;ofi_rxm",
            close_hangs_after_loss: provider.ends_with("ofi_rxm"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Quirks;

    #[test]
    fn each_workaround_is_for_the_providers_that_need_it() {
        for p in ["tcp;ofi_rxm", "shm", "udp;ofi_rxd"] {
            assert!(Quirks::of(p).cuts_oversized_badly, "{p}");
        }
        for p in ["tcp", "sockets", "verbs;ofi_rxm", "verbs", "net"] {
            assert!(!Quirks::of(p).cuts_oversized_badly, "{p}");
        }
        assert!(Quirks::of("verbs;ofi_rxm").reposts_credits_on_close);
        assert!(!Quirks::of("tcp;ofi_rxm").reposts_credits_on_close);
        assert!(Quirks::of("tcp;ofi_rxm").close_hangs_after_loss);
        assert!(Quirks::of("verbs;ofi_rxm").close_hangs_after_loss);
        assert!(!Quirks::of("shm").close_hangs_after_loss);
        assert!(!Quirks::of("tcp").close_hangs_after_loss);
    }
}
