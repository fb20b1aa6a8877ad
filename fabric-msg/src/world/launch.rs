//! How this process was started, and the exchange each launcher offers:
//! PMIx (a launcher such as `mpirun` or `srun --mpi=pmix` serves it), the
//! plain rendezvous (`FABRIC_MSG_RANK`, `FABRIC_MSG_SIZE`,
//! `FABRIC_MSG_ROOT`), or a world of one.

use super::liveness::Liveness;
pub(crate) use super::placement::Placement;
use super::pmix::{Pmix, PmixError};
use super::rendezvous::Rendezvous;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// Where rank and size came from.
#[derive(Debug)]
pub(crate) enum Launcher {
    /// A PMIx server (`mpirun`, `srun --mpi=pmix`, `prterun`) for rank,
    /// size and the exchanges, plus rendezvous connections to rank 0 for
    /// liveness (PMIx tells survivors nothing of a death on Open MPI 4.1.4
    /// with PMIx 4.2.2: see `docs/world.md`).
    Pmix(Box<Pmix>, Rendezvous),
    /// fabric-msg's own rendezvous at rank 0.
    Rendezvous(Rendezvous),
    /// Nothing set: this process is the whole world.
    Single,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn parse_u32(name: &str, value: &str) -> Result<u32> {
    value.trim().parse().map_err(|_| Error::Launch {
        launcher: "rendezvous",
        message: format!("{name}={value:?} is not a whole number"),
    })
}

impl Launcher {
    /// Find out how this process was started: PMIx first, then the
    /// rendezvous variables, then a world of one.
    pub(crate) fn detect(start_timeout: Duration) -> Result<(Launcher, Placement)> {
        if let Some(pmix) = Pmix::connect(start_timeout).map_err(pmix_error)? {
            let placement = pmix_placement(&pmix)?;
            let local = placement.local_ranks.len() == placement.size as usize;
            let (bind, host) = if local {
                (std::net::IpAddr::from([127, 0, 0, 1]), "127.0.0.1".to_string())
            } else {
                let host = pmix.hostname().map_err(pmix_error)?;
                (std::net::IpAddr::from([0, 0, 0, 0]), host)
            };
            let star = Rendezvous::star(
                placement.rank,
                placement.size,
                bind,
                &host,
                |mine| {
                    const KEY: &str = "fabric-msg.liveness";
                    let all = pmix_allgather(&pmix, KEY, mine.unwrap_or_default().as_bytes(), start_timeout)?;
                    String::from_utf8(all[0].clone())
                        .map_err(|_| pmix_error_text("rank 0's liveness address is not text"))
                },
                start_timeout,
            )?;
            return Ok((Launcher::Pmix(Box::new(pmix), star), placement));
        }
        let (rank, size, root) = (
            env("FABRIC_MSG_RANK"),
            env("FABRIC_MSG_SIZE"),
            env("FABRIC_MSG_ROOT"),
        );
        match (rank, size, root) {
            (None, None, None) => Ok((
                Launcher::Single,
                Placement {
                    rank: 0,
                    size: 1,
                    local_rank: 0,
                    local_ranks: vec![0],
                },
            )),
            (Some(rank), Some(size), Some(root)) => {
                let (rank, size) = (
                    parse_u32("FABRIC_MSG_RANK", &rank)?,
                    parse_u32("FABRIC_MSG_SIZE", &size)?,
                );
                if size == 0 || size > super::tags::MAX_RANKS || rank >= size {
                    return Err(Error::Launch {
                        launcher: "rendezvous",
                        message: format!(
                            "FABRIC_MSG_RANK={rank} with FABRIC_MSG_SIZE={size}: the rank must be below the \
                             size, and the size between 1 and {}",
                            super::tags::MAX_RANKS
                        ),
                    });
                }
                let r = Rendezvous::start(rank, size, &root, start_timeout)?;
                // Without a launcher to say which ranks share a node, a
                // loopback root means every rank is on this host.
                let local = r.local_ip().is_some_and(|ip| ip.is_loopback());
                let local_ranks = if local { (0..size).collect() } else { vec![rank] };
                let local_rank = if local { rank } else { 0 };
                Ok((
                    Launcher::Rendezvous(r),
                    Placement {
                        rank,
                        size,
                        local_rank,
                        local_ranks,
                    },
                ))
            }
            (rank, size, root) => {
                let missing: Vec<&str> = [
                    ("FABRIC_MSG_RANK", rank.is_none()),
                    ("FABRIC_MSG_SIZE", size.is_none()),
                    ("FABRIC_MSG_ROOT", root.is_none()),
                ]
                .into_iter()
                .filter(|(_, m)| *m)
                .map(|(n, _)| n)
                .collect();
                Err(Error::Launch {
                    launcher: "rendezvous",
                    message: format!(
                        "{} not set: a rendezvous launch needs FABRIC_MSG_RANK, FABRIC_MSG_SIZE and \
                         FABRIC_MSG_ROOT=host:port on every rank (or none of them for a world of one)",
                        missing.join(", ")
                    ),
                })
            }
        }
    }

    /// `"pmix"`, `"rendezvous"` or `"single"`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Launcher::Pmix(..) => "pmix",
            Launcher::Rendezvous(_) => "rendezvous",
            Launcher::Single => "single",
        }
    }

    /// Every rank's `mine`, by rank, within `timeout`. `round` names the
    /// exchange (a PMIx key).
    pub(crate) fn allgather(&mut self, round: &str, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        match self {
            Launcher::Pmix(p, _) => pmix_allgather(p, round, mine, timeout),
            Launcher::Rendezvous(r) => r.allgather(mine, timeout),
            Launcher::Single => Ok(vec![mine.to_vec()]),
        }
    }

    /// From now on, record ranks that go away in `live`.
    pub(crate) fn watch(&mut self, live: Arc<Liveness>) -> Result<()> {
        match self {
            Launcher::Pmix(_, star) => star.watch(live),
            Launcher::Rendezvous(r) => r.watch(live),
            Launcher::Single => Ok(()),
        }
    }

    /// The address this rank reaches the others from, where known.
    pub(crate) fn local_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Launcher::Rendezvous(r) => r.local_ip(),
            _ => None,
        }
    }

    /// Leave the world in order, waiting at most `timeout` for the others
    /// and calling `progress` while it waits.
    pub(crate) fn finish(&mut self, timeout: Duration, progress: &mut dyn FnMut()) -> Result<()> {
        match self {
            // The liveness connections' Bye/Done is already a barrier of
            // every rank; PMIx_Finalize (on drop) needs no fence before it.
            Launcher::Pmix(_, star) => star.finish(timeout, progress),
            Launcher::Rendezvous(r) => r.finish(timeout, progress),
            Launcher::Single => Ok(()),
        }
    }

    /// Leave a world that lost a rank: close the liveness connections (the
    /// others know already; under PMIx all survivors together at exit, as
    /// `mpirun` ends the job on the first exit: see
    /// [`Rendezvous::leave_at_exit`]) and let this process end without
    /// `PMIx_Finalize`, whose wait for the server stalls a survivor about
    /// 2 s under `mpirun` once a rank died (docs/decisions.md).
    pub(crate) fn leave_after_loss(&mut self, live: &Arc<Liveness>) {
        match self {
            Launcher::Pmix(p, star) => {
                star.leave_at_exit(live.clone());
                p.skip_finalize();
            }
            Launcher::Rendezvous(r) => r.hang_up(),
            Launcher::Single => {}
        }
    }

    /// End the whole job: through PMIx where there is one; otherwise this
    /// process exits and the others see it go.
    ///
    /// Under PMIx, once a rank is lost (`live`), every other rank has been
    /// told (rank 0 relays each loss) and fails on its own, naming it. An
    /// immediate `PMIx_Abort` would kill them before they can: Slurm's
    /// `srun --mpi=pmix` SIGKILLs the whole step within a few milliseconds
    /// of it (Open MPI's `mpirun` gives them about a second). So then a rank
    /// other than 0 only exits, and rank 0 waits up to `grace` for all
    /// `size - 1` others to be gone, calling `PMIx_Abort` only if some are
    /// still there, for a rank that never looks at the World again.
    pub(crate) fn abort(
        &mut self,
        code: i32,
        message: &str,
        live: &Liveness,
        size: u32,
        grace: Duration,
    ) -> ! {
        let code = if code == 0 { 1 } else { code };
        if let Launcher::Pmix(p, _) = self {
            let lost = live.first_lost().is_some();
            let others_leave_alone = lost && (p.rank() != 0 || all_others_gone(live, size, grace));
            if !others_leave_alone {
                if let Err(e) = p.abort(code, message) {
                    eprintln!("fabric-msg: {e}");
                }
                // mpirun ends every rank about a second after PMIx_Abort.
                std::thread::sleep(Duration::from_secs(2));
            }
        }
        eprintln!("fabric-msg: aborting the world: {message}");
        std::process::exit(code)
    }
}

/// Rank 0: whether every other rank is gone (each one's liveness
/// connection closed) within `grace`.
fn all_others_gone(live: &Liveness, size: u32, grace: Duration) -> bool {
    let until = std::time::Instant::now() + grace;
    loop {
        if live.all().len() + 1 >= size as usize {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pmix_error(e: PmixError) -> Error {
    Error::Launch {
        launcher: "pmix",
        message: e.to_string(),
    }
}

fn pmix_error_text(message: &str) -> Error {
    Error::Launch {
        launcher: "pmix",
        message: message.to_string(),
    }
}

/// Rank, size and the node's ranks, from the PMIx server.
fn pmix_placement(p: &Pmix) -> Result<Placement> {
    let size = p.job_size().map_err(pmix_error)?;
    let rank = p.rank();
    if size == 0 || size > super::tags::MAX_RANKS || rank >= size {
        return Err(pmix_error_text(&format!(
            "PMIx namespace {} says rank {rank} of {size}: a world has 1 to {} ranks",
            p.namespace(),
            super::tags::MAX_RANKS
        )));
    }
    let mut local_ranks = p.local_peers().map_err(pmix_error)?;
    local_ranks.sort_unstable();
    local_ranks.dedup();
    Ok(Placement {
        rank,
        size,
        local_rank: u32::from(p.local_rank().map_err(pmix_error)?),
        local_ranks,
    })
}

/// Largest value one rank may publish in an exchange.
const MAX_PUBLISHED: usize = 1 << 20;

/// Every rank's `mine` by rank: `PMIx_Put` + `PMIx_Commit`, a fence that
/// collects the data, then `PMIx_Get` of each rank's value, as MPI
/// libraries exchange their endpoint addresses.
fn pmix_allgather(p: &Pmix, key: &str, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
    let size = p.job_size().map_err(pmix_error)?;
    p.put(key, mine).map_err(pmix_error)?;
    p.commit().map_err(pmix_error)?;
    p.fence(true, timeout).map_err(pmix_error)?;
    (0..size)
        .map(|r| p.get(r, key, MAX_PUBLISHED, timeout).map_err(pmix_error))
        .collect()
}
