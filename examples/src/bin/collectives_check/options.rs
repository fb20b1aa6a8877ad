//! The command line: which checks or which misuse a run does (the usage
//! is at the top of `collectives_check.rs`).

use super::misuse::Misused;

pub(super) enum Mode {
    Check {
        seed: u64,
        quick: bool,
        /// A dup of the World first, alive through every check.
        dup_first: bool,
    },
    Loop(usize),
    /// Elements rank 0 and the others pass; `None`: the last rank passes one more.
    Mismatch(Option<(usize, usize)>),
    BadOp,
    BadScatterv,
    AlltoallvMismatch,
    /// The last rank computes this many seconds before its collectives.
    Late(u64),
}

/// The mode, whether `--messages` was given, the misused call, and
/// whether `--on-comm` was given.
pub(super) fn parse() -> Result<(Mode, bool, Misused, bool), String> {
    let mut mode = Mode::Check {
        seed: 1,
        quick: false,
        dup_first: false,
    };
    let mut messages = false;
    let mut misused = Misused::Allreduce;
    let mut on_comm = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Result<u64, String> {
            let v = args.next().ok_or(format!("{a} needs {what}"))?;
            v.parse().map_err(|_| format!("{a} {v}: not a whole number"))
        };
        match a.as_str() {
            "--seed" => {
                let s = num("a seed")?;
                if let Mode::Check { seed, .. } = &mut mode {
                    *seed = s;
                }
            }
            "--quick" => {
                if let Mode::Check { quick, .. } = &mut mode {
                    *quick = true;
                }
            }
            "--dup-first" => {
                if let Mode::Check { dup_first, .. } = &mut mode {
                    *dup_first = true;
                }
            }
            "--loop" => mode = Mode::Loop(num("a size in bytes")? as usize),
            "--late" => mode = Mode::Late(num("seconds")?),
            "--mismatch" => mode = Mode::Mismatch(None),
            "--lengths" => {
                let v = args.next().ok_or("--lengths needs FIRST,OTHERS")?;
                let pair = v
                    .split_once(',')
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                    .ok_or(format!("--lengths {v}: not two whole numbers FIRST,OTHERS"))?;
                mode = Mode::Mismatch(Some(pair));
            }
            "--messages" => messages = true,
            "--on-comm" => on_comm = true,
            "--call" => {
                misused = match args.next().as_deref() {
                    Some("allreduce") => Misused::Allreduce,
                    Some("reduce") => Misused::Reduce,
                    Some("broadcast") => Misused::Broadcast,
                    Some("barrier") => Misused::Barrier,
                    Some("ibarrier") => Misused::Ibarrier,
                    Some("persistent-barrier") => Misused::PersistentBarrier,
                    Some("iallreduce") => Misused::Iallreduce,
                    Some("ireduce") => Misused::Ireduce,
                    other => {
                        return Err(format!(
                            "--call {other:?}: allreduce, reduce, broadcast, barrier, ibarrier, persistent-barrier, \
                             iallreduce or ireduce"
                        ))
                    }
                }
            }
            "--bad-op" => mode = Mode::BadOp,
            "--bad-scatterv" => mode = Mode::BadScatterv,
            "--alltoallv-mismatch" => mode = Mode::AlltoallvMismatch,
            "-h" | "--help" => {
                return Err(
                    "usage: collectives_check [--messages] [--seed N] [--quick] [--dup-first] | --loop BYTES [--call iallreduce] | --mismatch [--lengths FIRST,OTHERS] | --bad-op [--call reduce|broadcast|barrier|ibarrier|persistent-barrier|iallreduce|ireduce] | --bad-scatterv | --alltoallv-mismatch | --late SECS"
                        .into(),
                )
            }
            other => return Err(format!("unknown option {other}; try --help")),
        }
    }
    if matches!(mode, Mode::BadOp)
        && matches!(
            misused,
            Misused::Broadcast | Misused::Barrier | Misused::Ibarrier | Misused::PersistentBarrier
        )
    {
        return Err(
            "--bad-op --call broadcast|barrier|ibarrier|persistent-barrier: the call takes no op".into(),
        );
    }
    Ok((mode, messages, misused, on_comm))
}
