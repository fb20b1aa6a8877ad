//! The [`World`] itself: its fields, what it says of itself (rank, size,
//! placement, fabric), the parts it lends the collectives' engine, and how
//! it leaves (`finish`, `abort`, and its drop). Joining is in
//! `startup.rs`; point-to-point messages in `point_to_point.rs`; the
//! collectives in `collective_calls.rs`; symmetric memory in `symmetric.rs`.

use super::collectives::engine::Engine;
use super::collectives::io::Io;
use super::collectives::on_node::NodeColl;
use super::collectives::scope::ContextPool;
use super::launch::{Launcher, Placement};
use super::liveness::{named_loss, Liveness};
use super::local::Local;
use super::messages::Messages;
use crate::discovery::profile::Profile;
use crate::error::{Error, Result};
use crate::transport::event_loop::{EndpointId, EventLoop, Peer};
use crate::transport::liveness::LOSS_GRACE;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// This process's place in a world of ranks, wired on one fabric.
#[derive(Debug)]
pub struct World {
    pub(super) ev: EventLoop,
    pub(super) ep: EndpointId,
    /// By rank; this rank's own address too (a message to oneself works).
    pub(super) peers: Vec<Peer>,
    /// The shared-memory loop for ranks on this node, where the world's
    /// fabric is another (`local.rs`).
    pub(super) local: Option<Local>,
    /// Where this rank announces its larger messages: the ranks that match
    /// every message in one place (`announce.rs`); `None` where no rank
    /// does.
    pub(super) announcer: Option<super::announce::Announcer>,
    /// Which ranks `local` reaches, or why there is none.
    pub(super) shm_report: String,
    pub(super) placement: Placement,
    /// The ranks on this rank's node as fabric-msg sees nodes
    /// (`FABRIC_MSG_NODE` where set, otherwise the host name), ascending.
    pub(super) node_ranks: Vec<u32>,
    pub(super) launcher: Launcher,
    pub(super) live: Arc<Liveness>,
    pub(super) report: Option<String>,
    pub(super) finish_timeout: Duration,
    pub(super) finished: bool,
    /// The collectives: their numbering, runs in flight, and the
    /// application's completions that arrived while one was waited for.
    /// Declared after `ev` and `local`, so dropped after both: runs that
    /// failed with operations in flight keep their memory here until the
    /// event loops have closed the endpoints those operations were posted
    /// on.
    pub(super) coll: Engine,
    /// This rank's free communicator context ids (`comm.rs`).
    pub(super) contexts: Arc<ContextPool>,
    /// Typed messages in flight (`messages.rs`).
    pub(super) msgs: Messages,
    /// One-sided operations' scratch memory and what is in flight (`one_sided.rs`).
    pub(super) one_sided: super::scratch::OneSided,
    /// Where every rank is on this node: the small collectives' shared
    /// memory (`collectives/on_node.rs`), out of the World while one runs.
    pub(super) node_coll: Option<NodeColl>,
    /// Non-blocking collectives in those slots, oldest first
    /// (`node_requests.rs`).
    pub(super) slot_requests: super::collectives::slot_queue::SlotRequests,
    /// Whether collectives may use slots at all (`WorldConfig::node_collectives`).
    pub(super) node_collectives: bool,
    /// Collectives run in slots so far, blocking and not (`WorldStats::node_collectives`).
    pub(super) slot_calls: u64,
    /// Of those, the ones read with one copy (`WorldStats::node_single_copy_collectives`).
    pub(super) single_copy_calls: u64,
    /// Where the World spans nodes: its node and leaders' communicators,
    /// for its blocking collectives in two levels (`two_level.rs`).
    pub(super) two_level: Option<Arc<super::comm_handle::TwoLevel>>,
    /// The World's collectives run in two levels so far
    /// (`WorldStats::two_level_collectives`).
    pub(super) two_level_calls: u64,
    /// Of those, the non-blocking and persistent ones
    /// (`WorldStats::two_level_requests`).
    pub(super) two_level_requests: u64,
    /// Those in flight, as chains of their steps (`two_level_requests.rs`).
    pub(super) chains: Vec<Box<dyn super::two_level_chain::Chained>>,
    /// Turns that moved something (a completion taken): an awaited wait
    /// keeps looking while these grow (`awaiting.rs`).
    pub(super) moved: u64,
}

impl World {
    /// This process's rank, from 0.
    pub fn rank(&self) -> u32 {
        self.placement.rank
    }

    /// How many ranks the world has.
    pub fn size(&self) -> u32 {
        self.placement.size
    }

    /// This rank's index among the ranks on its node.
    pub fn local_rank(&self) -> u32 {
        self.placement.local_rank
    }

    /// The ranks the launcher placed on this host, this one included,
    /// ascending (as `OMPI_COMM_WORLD_LOCAL_*` or Slurm's local ids):
    /// what shares this machine's cores.
    pub fn local_ranks(&self) -> &[u32] {
        &self.placement.local_ranks
    }

    /// The ranks on this rank's node as fabric-msg sees nodes, this one
    /// included, ascending: those with the same `FABRIC_MSG_NODE` where it
    /// is set (one machine standing in for several nodes), otherwise those
    /// on the same host, as [`local_ranks`](Self::local_ranks). The node
    /// transport, the collectives in shared memory and
    /// [`split_shared`](Self::split_shared) follow it.
    pub fn node_ranks(&self) -> &[u32] {
        &self.node_ranks
    }

    /// How the world was launched: `"pmix"`, `"rendezvous"` or `"single"`.
    pub fn launcher(&self) -> &'static str {
        self.launcher.name()
    }

    /// The fabric every rank uses.
    pub fn profile(&self) -> &Profile {
        self.ev.profile()
    }

    /// Why the world uses a worse fabric than some rank's first choice
    /// (the same sentence on every rank); `None` where all chose alike.
    pub fn fabric_report(&self) -> Option<&str> {
        self.report.as_deref()
    }

    /// The ranks this rank reaches over shared memory rather than the
    /// world's fabric: the other ranks on its node, over fabric-msg's node
    /// transport, or over libfabric's `shm` (`FABRIC_MSG_SHM=libfabric`)
    /// where the world's fabric is not `shm` itself. Empty when there are
    /// none.
    pub fn shm_ranks(&self) -> Vec<u32> {
        self.local.as_ref().map_or_else(Vec::new, Local::ranks)
    }

    /// Whether this rank matches every application message, from its node
    /// and from the fabric, in one engine (`WorldConfig::one_engine`,
    /// agreed by every rank, in a World that spans nodes).
    pub fn one_engine(&self) -> bool {
        self.local.as_ref().is_some_and(Local::one_engine)
    }

    /// Why a receive from any rank may match wrongly on this World, or
    /// `None` where it matches as MPI says. Only a World whose messages
    /// go over libfabric's shm before 1.19 (`Profile::tag_mask_defect`,
    /// docs/world.md, "Known gap") has such a reason: with fabric-msg's
    /// node transport (the default) same-node messages never reach it.
    pub fn any_source_defect(&self) -> Option<&str> {
        match self.local.as_ref() {
            Some(l) if l.carries_all() => None,
            _ if self.ev.profile().provider == "shm" => self.ev.profile().tag_mask_defect.as_deref(),
            _ => None,
        }
    }

    /// Which ranks are reached over shared memory, or why none are (the
    /// same-node path is off, the world is on `shm` already, no other rank
    /// is on this node, or shm could not be opened).
    pub fn shm_report(&self) -> &str {
        &self.shm_report
    }

    /// The event loop of the world's fabric, for everything the World
    /// does not wrap (RMA, registration, atomics with [`World::peer`]).
    /// Every rank is reached through it, also those that messages reach
    /// over shared memory ([`World::shm_ranks`]).
    pub fn event_loop(&mut self) -> &mut EventLoop {
        &mut self.ev
    }

    /// The endpoint every rank's peer is reached through.
    pub fn endpoint(&self) -> EndpointId {
        self.ep
    }

    /// The peer for `rank`, for the event loop's own operations.
    pub fn peer(&self, rank: u32) -> Result<&Peer> {
        self.check_rank(rank)?;
        Ok(&self.peers[rank as usize])
    }

    /// Ranks known to be gone, in the order they were noticed.
    pub fn lost_ranks(&self) -> Vec<u32> {
        self.live.all()
    }

    pub(super) fn check_rank(&self, rank: u32) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::Usage(format!(
                "rank {rank} is not in this world of {} ranks",
                self.size()
            )));
        }
        if let Some(lost) = self.live.first_lost() {
            return Err(self.lost(lost));
        }
        Ok(())
    }

    pub(super) fn lost(&self, rank: u32) -> Error {
        Error::RankLost {
            rank,
            why: self.live.why(rank).unwrap_or_default(),
        }
    }

    /// A call's outcome: where it failed and a rank is known lost by now,
    /// that loss (as the flat schedules report it), whichever step saw it
    /// (a collective in two levels, one that read the others' memory).
    ///
    /// Where the failure is another rank's that names a loss ("rank 2 is
    /// lost", refused to this rank in a step it shares with that rank),
    /// this rank waits up to [`LOSS_GRACE`] for its own liveness to hear
    /// of the loss, as the flat schedules wait after a failed send: the
    /// other rank's refusal can come first (a communicator's two levels
    /// in CI, 2026-11-29).
    pub(super) fn settled<T>(&self, outcome: Result<T>) -> Result<T> {
        let e = match outcome {
            Err(e) if !matches!(e, Error::RankLost { .. }) => e,
            other => return other,
        };
        let grace = match &e {
            Error::Collective { message, .. } if named_loss(message).is_some() => LOSS_GRACE,
            _ => Duration::ZERO,
        };
        match self.live.first_lost_within(grace) {
            Some(rank) => Err(self.lost(rank)),
            None => Err(e),
        }
    }

    /// The World's parts the collectives' engine works with.
    pub(crate) fn engine_io(&mut self) -> (&mut Engine, Io<'_>) {
        let io = Io {
            ev: &mut self.ev,
            ep: self.ep,
            peers: &self.peers,
            local: self.local.as_mut(),
            rank: self.placement.rank,
            live: &self.live,
        };
        (&mut self.coll, io)
    }

    /// Leave the world in order: finish the collectives still in flight
    /// (other ranks may need this rank's part), then wait — at most the
    /// configured finish timeout in all — until every rank has finished, so
    /// no rank's exit is taken for a death.
    pub fn finish(mut self) -> Result<()> {
        self.finished = true;
        let until = Instant::now() + self.finish_timeout;
        let mut drained = Ok(());
        while (self.coll.in_flight() > 0 || !self.slot_requests.is_empty()) && Instant::now() < until {
            // Calls queued in the node's slots (`node_requests.rs`): the
            // others may wait for this rank's part or its `done`.
            if let Err(e) = self.progress_slot_requests() {
                drained = Err(e);
                break;
            }
            let may_sleep = self.slot_requests.is_empty();
            let (engine, mut io) = self.engine_io();
            match engine.poll_once(&mut io, may_sleep) {
                Ok(true) => {}
                Ok(false) => engine.idle(),
                Err(e) => {
                    drained = Err(e);
                    break;
                }
            }
        }
        let unfinished = self.coll.in_flight() + self.slot_requests.len();
        if unfinished > 0 {
            log::warn!(
                "leaving the world with {} collective(s) unfinished after {:?}",
                unfinished,
                self.finish_timeout
            );
        }
        let mut progress = progress_while_leaving(&mut self.ev, self.local.as_mut(), &self.live);
        let left = self.launcher.finish(self.finish_timeout, &mut progress);
        // Every rank has said goodbye: give the provider's own traffic
        // still in flight (ofi_rxm's acknowledgements) a last chance to
        // complete before the endpoint closes.
        for _ in 0..3 {
            progress();
        }
        drained.and(left)
    }

    /// End the whole job now: through the launcher where it can (PMIx), by
    /// exiting otherwise — the other ranks see this rank lost.
    ///
    /// After a rank was lost, every rank already knows and fails on its
    /// own; under PMIx the job is then left to end by itself so each rank
    /// can say which rank it lost: ranks other than 0 just exit, and rank 0
    /// waits for them (at most `LoopConfig::post_timeout` and a second)
    /// before it asks the launcher to end whichever are still running.
    pub fn abort(&mut self, code: i32, message: &str) -> ! {
        let grace = self.ev.cfg.post_timeout.unwrap_or(Duration::from_secs(5)) + Duration::from_secs(1);
        let size = self.size();
        self.launcher.abort(code, message, &self.live, size, grace)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // The event loop closes after this: see liveness.rs on a lost
        // rank's shm lock.
        let launcher = self.launcher.name();
        self.live
            .enter_for_good(format!("the World's teardown (leaving the {launcher} launcher)"));
        if self.live.first_lost().is_some() {
            // The world is broken and every rank knows: nobody waits for
            // anybody, and PMIx_Finalize is skipped (docs/decisions.md), so
            // the application's own error is out before a launcher's kill.
            self.launcher.leave_after_loss(&self.live);
        } else if !self.finished {
            let mut progress = progress_while_leaving(&mut self.ev, self.local.as_mut(), &self.live);
            if let Err(e) = self.launcher.finish(self.finish_timeout, &mut progress) {
                log::warn!("leaving the world: {e}");
            }
        }
        // The fields drop next, the event loops first.
        let provider = &self.ev.profile().provider;
        self.live.now_doing(format!(
            "the World's teardown (closing its libfabric endpoints, {provider} provider, where a lock the \
             lost process held can keep it)"
        ));
    }
}

/// What a rank does while it waits for the others to leave: keep its
/// provider progressing. Under manual progress (`tcp;ofi_rxm`, `shm`,
/// `verbs;ofi_rxm`) a rank that stops reading its CQ stalls whatever the
/// others still need from it (a rendezvous read of its send buffer, a
/// one-sided operation on its memory, ofi_rxm's acknowledgements), and
/// leaves such operations to be flushed when its endpoint closes: with
/// libfabric 1.17's `verbs;ofi_rxm` that flush crashed a rank of a
/// finished two-host ring (SIGSEGV: `rxm_close_conn` reposts a receive
/// completion on the connection's closed MSG endpoint; docs/world.md). Completions that arrive now are the
/// application's no longer: they are dropped, with their buffers. Once a
/// rank is lost it stops: the others are leaving with an error anyway, and
/// on shm a read of the CQ can spin for ever on a lock the lost rank held.
fn progress_while_leaving<'a>(
    ev: &'a mut EventLoop,
    mut local: Option<&'a mut Local>,
    live: &Arc<Liveness>,
) -> impl FnMut() + 'a {
    let mut scratch = Vec::new();
    let live = live.clone();
    move || {
        if live.first_lost().is_none() {
            let _call = live.call();
            let _ = ev.poll(&mut scratch, Some(Duration::ZERO));
            if let Some(l) = local.as_mut() {
                let _ = l.side.poll_now(&mut scratch);
                l.forget();
            }
            scratch.clear();
        }
    }
}
