//! Shared code of fabric-msg's example tools: the options `pingpong` and
//! `bandwidth` have in common, their output (fabtests' columns or JSON
//! Lines), the byte pattern `--verify` checks, and the session around each
//! tool's measuring loop, and the per-iteration times behind the
//! percentiles every tool prints; and the tally and the random generator
//! of the checking tools.
#![deny(missing_docs)]

pub mod control;
pub mod opts;
pub mod output;
pub mod pattern;
pub mod rng;
pub mod session;
pub mod stats;
pub mod tally;

/// `println!` for the tools' results: when stdout is gone (`| head`), end
/// the process quietly instead of panicking on the broken pipe.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}
