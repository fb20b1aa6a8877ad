//! World: one program started N times, N ranks wired on one fabric.
//!
//! ```no_run
//! use fabric_msg::{Buffer, Token, World};
//! use std::time::Duration;
//!
//! let mut world = World::init()?; // mpirun, srun --mpi=pmix, the rendezvous variables, or alone
//! let (rank, size) = (world.rank(), world.size());
//! world.recv(Some((rank + size - 1) % size), Some(7), Buffer::new(64), Token(1))?;
//! world.send((rank + 1) % size, 7, Buffer::from_slice(b"hello"), Token(2))?;
//! let mut done = Vec::new();
//! while done.len() < 2 {
//!     let mut batch = Vec::new();
//!     world.poll(&mut batch, Some(Duration::from_secs(10)))?;
//!     done.extend(batch);
//! }
//! world.finish()?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! Lives here: the top layer, which may use every layer below (transport,
//! memory, discovery, errors) and which nothing below uses. How the process
//! was launched (`launch`: PMIx, the rendezvous, or alone), the exchanges
//! each launcher offers (`pmix`, `rendezvous`), how the ranks agree on one
//! fabric (`agree`, with `startup`'s helpers), the same-node ranks reached
//! over shared memory beside it (`local`), the tag layout that carries the
//! sending rank (`tags`),
//! what is known of ranks that went away (`liveness`), the collectives
//! (`collectives/`) and the memory every rank registers at once
//! (`symmetric`). See `docs/world.md` and `docs/collectives.md`.

mod admission;
mod agree;
pub mod collectives;
mod config;
mod launch;
mod leaving;
mod liveness;
mod local;
mod placement;
mod pmix;
mod rendezvous;
mod startup;
pub mod symmetric;
mod tags;

pub use config::WorldConfig;
pub use tags::MAX_RANKS;

pub(crate) use pmix::fuzz_local_peers;
pub(crate) use rendezvous::{fuzz_frame as fuzz_rendezvous_frame, fuzz_seeds as fuzz_rendezvous_seeds};

use crate::discovery::config::LadderConfig;
use crate::discovery::negotiate::EndpointChoice;
use crate::discovery::profile::{check_peer, Profile};
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::idle::Idler;
use crate::transport::event_loop::{
    Completion, EndpointId, EventLoop, Peer, PostError, RecvOpts, SendOpts, Token, WaitMode,
};
use crate::transport::liveness::LOSS_GRACE;
use agree::{decide, Choice, ChosenRung};
use collectives::engine::Engine;
use collectives::io::{is_reserved, Io};
use launch::{Launcher, Placement};
use liveness::Liveness;
use local::{Local, Published};
use startup::{exchange, first_choice, hostname, interface_of, open_rung, oversubscribed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// This process's place in a world of ranks, wired on one fabric.
#[derive(Debug)]
pub struct World {
    ev: EventLoop,
    ep: EndpointId,
    /// By rank; this rank's own address too (a message to oneself works).
    peers: Vec<Peer>,
    /// The shared-memory loop for ranks on this node, where the world's
    /// fabric is another (`local.rs`).
    local: Option<Local>,
    /// Which ranks `local` reaches, or why there is none.
    shm_report: String,
    placement: Placement,
    launcher: Launcher,
    live: Arc<Liveness>,
    report: Option<String>,
    finish_timeout: Duration,
    finished: bool,
    /// The collectives: their numbering, runs in flight, and the
    /// application's completions that arrived while one was waited for.
    /// Declared after `ev` and `local`, so dropped after both: runs that
    /// failed with operations in flight keep their memory here until the
    /// event loops have closed the endpoints those operations were posted
    /// on.
    coll: Engine,
}

impl World {
    /// Join the world this process was launched into, with
    /// [`WorldConfig::from_env`].
    pub fn init() -> Result<World> {
        World::init_with(WorldConfig::from_env()?)
    }

    /// Join the world with explicit settings.
    pub fn init_with(cfg: WorldConfig) -> Result<World> {
        let (mut launcher, placement) = Launcher::detect(cfg.start_timeout)?;
        let size = placement.size;
        let ladder = match cfg.ladder.clone() {
            Some(l) => l,
            None => LadderConfig::load(None)?,
        };
        let loop_config = waits_for(cfg.loop_config.clone(), placement.local_ranks.len());
        let mut req = cfg.requirements.clone();
        req.endpoint = EndpointChoice::Rdm;
        // FABRIC_MSG_NODE lays ranks out on pretend nodes: the launcher's
        // "all on this host" no longer holds.
        req.same_host =
            cfg.shared_memory && cfg.node.is_none() && placement.local_ranks.len() == size as usize;
        req.max_peers = req.max_peers.max(size as usize);
        let domain = cfg.domain.clone().or_else(|| interface_of(launcher.local_ip()));

        // Round 1: every rank's first choice; the world takes the worst.
        let mine = first_choice(&req, &ladder, domain.as_deref());
        let choice = Choice {
            host: local::node_name(cfg.node.as_deref(), hostname()),
            rung: mine
                .as_ref()
                .map(|p| ChosenRung::of(p, &ladder))
                .map_err(|e| e.to_string()),
        };
        let table = exchange(&mut launcher, "fabric-msg.choice", &choice, cfg.start_timeout)?;
        let nodes: Vec<String> = table.iter().map(|c| c.host.clone()).collect();
        let decision = decide(&table).map_err(|message| Error::Launch {
            launcher: launcher.name(),
            message,
        })?;
        let profile = match mine {
            Ok(p) if p.rung == decision.rung.label => Ok(p),
            _ => open_rung(&req, &ladder, domain.as_deref(), &decision.rung),
        };

        // Round 2: every rank's endpoint name and profile, or why it has none.
        let opened = profile.and_then(|p| {
            let mut ev = EventLoop::new(&p, loop_config.clone())?;
            // The collectives' classes are the World's alone (event_loop()
            // hands this loop to the application).
            ev.reserve_world_classes();
            let ep = ev.endpoint()?;
            let name = ev.name(ep)?;
            Ok((ev, ep, name))
        });
        let main = match &opened {
            Ok((ev, _, name)) => Ok((name.clone(), ev.wire_profile())),
            Err(e) => Err(format!("cannot open {}: {e}", decision.rung.label)),
        };
        // And, beside ranks on its node, its shared-memory endpoint.
        let not_wanted = local::wanted(cfg.shared_memory, &decision.rung.provider, &nodes, placement.rank);
        let shm = match not_wanted {
            Some(why) => Err(why),
            None => {
                local::open(&req, &ladder, loop_config.clone()).map_err(|e| format!("cannot open shm: {e}"))
            }
        };
        let mine = Published {
            main,
            local: match &shm {
                Ok((ev, _, name)) => Ok((name.clone(), ev.wire_profile())),
                Err(why) => Err(why.clone()),
            },
        };
        let table = exchange(&mut launcher, "fabric-msg.address", &mine, cfg.start_timeout)?;
        let launch_error = |message: String| Error::Launch {
            launcher: launcher.name(),
            message,
        };
        if let Some((r, why)) = table
            .iter()
            .enumerate()
            .find_map(|(r, t)| t.main.as_ref().err().map(|w| (r, w)))
        {
            return Err(launch_error(format!("rank {r} {why}")));
        }
        let (mut ev, ep, _) = opened?;
        let local = ev.wire_profile();
        let mut names = Vec::with_capacity(table.len());
        let mut agreements = Vec::with_capacity(table.len());
        for (r, entry) in table.iter().enumerate() {
            let (name, wire) = entry.main.clone().map_err(&launch_error)?;
            let agreement = check_peer(&local, &wire).map_err(|e| launch_error(format!("rank {r}: {e}")))?;
            if agreement.tag_bits < 64 {
                return Err(launch_error(format!(
                    "rank {r}: the fabric honours {} tag bits; the world needs 64",
                    agreement.tag_bits
                )));
            }
            names.push(name);
            agreements.push(agreement);
        }
        let peers = ev.insert_peers(ep, &names, &agreements)?;
        let has: Vec<bool> = table.iter().map(|p| p.local.is_ok()).collect();
        let pairs = local::pairs_of(placement.rank, &nodes, &has);
        let (mut shm, shm_report) = match shm {
            Ok((lev, lep, _)) => {
                let wired = Local::wire(lev, lep, size, &pairs, &table).map_err(&launch_error)?;
                let report = match &wired {
                    Some(_) => local::report(placement.rank, &pairs, &decision.rung.label),
                    None => "no other rank on this node published an shm endpoint".into(),
                };
                (wired, report)
            }
            Err(why) => (None, why),
        };
        let live = Arc::new(Liveness::new(placement.rank, local.provider.clone()));
        // A send stuck on a queue full of messages for a rank that died
        // fails with that rank's loss at once, not after post_timeout.
        ev.give_up = Some(live.flag());
        if let Some(l) = shm.as_mut() {
            l.ev.give_up = Some(live.flag());
        }
        launcher.watch(live.clone())?;
        let mut world = World {
            ev,
            ep,
            peers,
            local: shm,
            shm_report,
            placement,
            launcher,
            live,
            report: decision.why,
            finish_timeout: cfg.finish_timeout,
            finished: false,
            coll: Engine::new(Idler::new(&loop_config)),
        };
        let (engine, mut io) = world.engine_io();
        engine.listen(&mut io)?;
        Ok(world)
    }

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

    /// The ranks on this node, this one included, ascending.
    pub fn local_ranks(&self) -> &[u32] {
        &self.placement.local_ranks
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

    /// The ranks this rank reaches over shared memory (`shm`) rather than
    /// the world's fabric: the other ranks on its node, where the world's
    /// fabric is not `shm` itself. Empty when there are none.
    pub fn shm_ranks(&self) -> Vec<u32> {
        self.local.as_ref().map_or_else(Vec::new, Local::ranks)
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

    fn check_rank(&self, rank: u32) -> Result<()> {
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

    fn lost(&self, rank: u32) -> Error {
        Error::RankLost {
            rank,
            why: self.live.why(rank).unwrap_or_default(),
        }
    }

    /// Send `buf` to `to` with the application's `tag`.
    ///
    /// Tokens whose top byte is `0xFE` or `0xFD` are the World's own and
    /// are refused. To a rank on this node the message goes over shared
    /// memory where [`World::shm_ranks`] lists it.
    pub fn send(&mut self, to: u32, tag: u32, buf: Buffer, token: Token) -> Result<(), PostError> {
        let _call = self.live.call();
        if let Err(error) = self.check_rank(to).and_then(|()| check_token(token)) {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        let opts = SendOpts {
            tag: Some(tags::encode(tags::CLASS_USER, self.rank(), tag)),
            data: None,
        };
        let r = {
            let (_, mut io) = self.engine_io();
            let (ev, _, peer) = io.lane(to);
            ev.send(peer, buf, opts, token)
        };
        r.map_err(|e| self.explain_post(e))
    }

    /// An operation that failed while a rank was being lost (a send to a
    /// dead rank fills its queue first) fails as that rank's loss.
    fn explain_post(&self, mut e: PostError) -> PostError {
        if let Some(r) = self.live.first_lost() {
            e.error = self.lost(r);
        }
        e
    }

    /// Receive into `buf` from `from` (`None`: any rank) with `tag`
    /// (`None`: any tag). [`World::source`] and [`World::tag`] say what
    /// arrived. Tokens whose top byte is `0xFE` or `0xFD` are refused, as for
    /// [`World::send`].
    pub fn recv(
        &mut self,
        from: Option<u32>,
        tag: Option<u32>,
        buf: Buffer,
        token: Token,
    ) -> Result<(), PostError> {
        let _call = self.live.call();
        let checked = match from {
            Some(r) => self.check_rank(r),
            None => self.live.first_lost().map_or(Ok(()), |r| Err(self.lost(r))),
        }
        .and_then(|()| check_token(token));
        if let Err(error) = checked {
            return Err(PostError {
                error,
                buffer: Some(buf),
            });
        }
        let want = local::user_matcher(from, tag);
        let opts = RecvOpts {
            tag: Some(want),
            from: None,
        };
        let r = match self.local.as_mut() {
            None => self.ev.recv(self.ep, buf, opts, token),
            Some(l) => match l.claim(want, buf, token) {
                Ok(()) => Ok(()),
                Err(buf) => l.recv(&mut self.ev, self.ep, from, tag, buf, token),
            },
        };
        r.map_err(|e| self.explain_post(e))
    }

    /// The rank a received message came from.
    pub fn source(&self, c: &Completion) -> u32 {
        tags::source_of(c.tag)
    }

    /// The application's tag of a received message.
    pub fn tag(&self, c: &Completion) -> u32 {
        tags::user_tag_of(c.tag)
    }

    /// [`EventLoop::poll`], failing with [`Error::RankLost`] once any rank
    /// of the world is gone (noticed within milliseconds of its process
    /// ending). A batch with a failed completion waits up to 300 ms for a
    /// loss to be noticed, so a send that failed because its peer died is
    /// reported as that rank's loss. A `None` timeout waits in slices, so a
    /// lost rank still ends the wait.
    ///
    /// Collectives started with the `i…` methods progress here too; their
    /// completions are never handed out. Completions of the application's
    /// operations that arrived while a collective was waited for come
    /// first.
    pub fn poll(&mut self, out: &mut Vec<Completion>, timeout: Option<Duration>) -> Result<usize> {
        let _call = self.live.call();
        const SLICE: Duration = Duration::from_millis(20);
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(r) = self.live.first_lost() {
                out.clear();
                return Err(self.lost(r));
            }
            out.clear();
            if self.coll.take_kept(out) > 0 {
                return Ok(out.len());
            }
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            let polled = self.engine_io().1.poll(out, Some(slice));
            let n = match polled {
                Ok(n) => n,
                Err(e) => return Err(self.live.first_lost().map_or(e, |r| self.lost(r))),
            };
            let n = if self.coll.in_flight() > 0 || out.iter().any(|c| is_reserved(c.token)) {
                let (engine, mut io) = self.engine_io();
                engine.filter(&mut io, out);
                out.len()
            } else {
                n
            };
            if n > 0 && out.iter().any(|c| c.result.is_err()) {
                // A send to a rank that just died fails on the fabric (FI_ECONNRESET
                // on tcp;ofi_rxm) a moment before its socket's end is seen:
                // give liveness that moment, and report the loss, naming the rank.
                if let Some(r) = self.wait_for_loss(LOSS_GRACE) {
                    out.clear();
                    return Err(self.lost(r));
                }
            }
            if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(n);
            }
        }
    }

    /// The first lost rank, waiting up to `grace` for one to be noticed.
    fn wait_for_loss(&self, grace: Duration) -> Option<u32> {
        let until = Instant::now() + grace;
        loop {
            if let Some(r) = self.live.first_lost() {
                return Some(r);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
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
        while self.coll.in_flight() > 0 && Instant::now() < until {
            let (engine, mut io) = self.engine_io();
            match engine.poll_once(&mut io) {
                Ok(true) => {}
                Ok(false) => engine.idle(),
                Err(e) => {
                    drained = Err(e);
                    break;
                }
            }
        }
        if self.coll.in_flight() > 0 {
            log::warn!(
                "leaving the world with {} collective(s) unfinished after {:?}",
                self.coll.in_flight(),
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
                let _ = l.ev.poll(&mut scratch, Some(Duration::ZERO));
                l.forget();
            }
            scratch.clear();
        }
    }
}

/// How this rank's loops wait (`transport/event_loop/idle.rs`): as `cfg`
/// says, except that where this node runs more ranks than this process
/// has cores (`startup::oversubscribed`) a wait gives the core away from
/// its first empty look: a spinning rank would hold the core the rank it
/// waits for needs to answer (200x slower for a DHT of 4 ranks on 2
/// cores), and sleeps on the CQ's fd after 2 ms of that where no
/// `yield_before_block` was set: the cores are better spent on the ranks
/// that have work. An explicit `WaitMode::Spin` then yields too.
fn waits_for(
    mut cfg: crate::transport::event_loop::LoopConfig,
    local_ranks: usize,
) -> crate::transport::event_loop::LoopConfig {
    if oversubscribed(local_ranks) {
        cfg.spin_before_block = Duration::ZERO;
        cfg.yield_before_block.get_or_insert(Duration::from_millis(2));
        if cfg.wait == WaitMode::Spin {
            cfg.wait = WaitMode::Adaptive;
        }
    }
    cfg
}

/// Refuse the tokens the collectives and the any-source pairs use.
fn check_token(token: Token) -> Result<()> {
    if is_reserved(token) || local::is_pair(token) {
        return Err(Error::Usage(format!(
            "token {:#x} is in the range the World uses (top byte 0xFE or 0xFD): choose another",
            token.0
        )));
    }
    Ok(())
}
