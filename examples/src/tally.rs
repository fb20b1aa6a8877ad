//! The checks a checking tool (`model_check`, `async_world`) makes between
//! ranks, and its last line: every rank prints how many passed, or each
//! one that failed and why, and the exit code says which.

use std::fmt::Debug;
use std::process::ExitCode;

/// The checks passed, and what failed.
#[derive(Debug, Default)]
pub struct Tally {
    /// How many checks passed.
    pub passed: usize,
    /// Each failed check: what, what came, what was wanted.
    pub failed: Vec<String>,
}

impl Tally {
    /// Count a check of `what`: passed if `got == want`.
    pub fn expect<T: PartialEq + Debug>(&mut self, what: &str, got: T, want: T) {
        if got == want {
            self.passed += 1;
        } else {
            self.failed.push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }

    /// The tool's end on rank `rank` of `size`: `rank R/N: K checks
    /// passed` and success, or every failure, the run's error and the
    /// World's leaving error, and failure.
    pub fn report(
        &self,
        tool: &str,
        (rank, size): (u32, u32),
        outcome: fabric_msg::Result<()>,
        finished: fabric_msg::Result<()>,
    ) -> ExitCode {
        match (outcome, finished) {
            (Ok(()), Ok(())) if self.failed.is_empty() => {
                println!("rank {rank}/{size}: {} checks passed", self.passed);
                ExitCode::SUCCESS
            }
            (outcome, finished) => {
                for f in &self.failed {
                    println!("rank {rank}/{size}: FAILED {f}");
                }
                if let Err(e) = outcome {
                    eprintln!("{tool}: rank {rank}: {e}");
                }
                if let Err(e) = finished {
                    eprintln!("{tool}: rank {rank}: leaving: {e}");
                }
                ExitCode::FAILURE
            }
        }
    }
}
