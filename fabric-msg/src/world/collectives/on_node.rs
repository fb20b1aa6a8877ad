//! The small collectives of a World whose ranks all share one node, in
//! shared memory: each rank posts its header and its contribution in its
//! own slots (`transport/node/slots.rs`), and reads the others' in place —
//! no message, no matching, no event loop in between (Open MPI's
//! `coll/sm`; the flat form of MPICH's shared-memory collectives).
//!
//! - **Which calls.** The blocking `barrier`, `allreduce`, `broadcast` and
//!   `reduce` on the World itself, where every rank is on this node and
//!   fabric-msg's node transport carries it (`world/node_collectives.rs`).
//!   The choice depends on nothing a rank could pass differently: every
//!   such call posts its header, whatever its length. One whose data fit a
//!   slot (`SLOT_DATA`) is done in the slots. A larger one waits until
//!   every rank's header agreed; then an allreduce, broadcast or reduce
//!   whose every rank may read every other's memory runs by reads of it
//!   (`on_node_copy.rs`: its header carries its data's address), and
//!   anything else goes on as a message schedule (`engine.rs`).
//! - **One round.** Collective `k` (numbered by this file, alike on every
//!   rank) waits until every rank is done reading `k - SLOTS`, posts its
//!   slot, rings the others' doorbells, then waits for every rank's stamp
//!   of `k`. An allreduce then folds every rank's data in rank order, so
//!   every rank computes the same expression and gets the same bits; a
//!   reduce does so on the root only; a broadcast copies the root's. A
//!   barrier is the wait itself. The rank then says it is done with `k`.
//! - **Checks.** Every header is checked against this rank's call before
//!   any data is read: the kind, the collective's number among the World's
//!   collectives, the bytes and element type, the root and the op. A
//!   difference fails the call on every rank with a message that names
//!   the rank that differs, as the message schedules do. A rank whose
//!   arguments are refused posts the refusal and its reason in its slot,
//!   so the others fail at once with that reason. A stamp outside the
//!   protocol (memory a peer corrupted) fails the call too; nothing a peer
//!   wrote is used before its length is checked.
//! - **Waiting and failure.** The wait for stamps turns the World
//!   (`World::turn`): other requests move on meanwhile, the World's
//!   waiting rule applies (spin, yield, then sleep on the doorbell, which
//!   every post rings), and a lost rank ends the wait with
//!   `Error::RankLost`.
//!
//! The non-blocking and persistent forms of these collectives, and those
//! of a communicator whose members all share this node
//! (`world/comm_slots.rs`), go through the same slots, queued
//! (`world/node_requests.rs`, `slot_queue.rs`, and `queued_copy.rs` past
//! a slot). Where one rank's call of a number is here and another's a
//! message schedule (another collective), the message schedule's probe
//! (`probe.rs`) reaches a rank waiting here, whose call then fails
//! (`Engine::slot_call_heard`) and tells the others.

use super::ops::{Element, Op, Reduction};
use crate::transport::event_loop::idle::Idler;
use crate::transport::node::slots::{Slots, HEAD_WORDS, SLOTS, SLOT_DATA};

/// What a collective is, in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Barrier = 1,
    Allreduce = 2,
    Broadcast = 3,
    Reduce = 4,
    /// The rank refused its call; the reason is its data, the call's own
    /// kind the header's second byte.
    Refused = 5,
}

impl Kind {
    fn name(code: u64) -> &'static str {
        match code {
            1 => "barrier",
            2 => "allreduce",
            3 => "broadcast",
            4 => "reduce",
            5 => "refused call",
            _ => "unknown collective",
        }
    }
}

/// `name` with "a" or "an" before it.
pub(crate) fn with_article(name: &str) -> String {
    let a = if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{a} {name}")
}

/// Why a call fails where rank `rank` is in collective `theirs` (number
/// `their_seq`) and this rank in `mine` (`my_seq`): the slots' header
/// check and a probe of the message schedules (`engine.rs`) say it alike.
pub(crate) fn another_collective(rank: u32, theirs: &str, their_seq: u32, mine: &str, my_seq: u32) -> String {
    format!(
        "rank {rank} is in {} (collective #{their_seq}) where this rank is in {} (collective #{my_seq}): every rank \
         must call the same collectives in the same order",
        with_article(theirs),
        with_article(mine)
    )
}

/// One rank's call: what every rank must agree on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub kind: Kind,
    pub what: &'static str,
    /// Its number among the World's collectives (the engine's).
    pub seq: u32,
    /// Elements of its data, their size and type name.
    pub n: usize,
    pub size: usize,
    pub type_name: &'static str,
    pub root: u32,
    /// The reduction: an `Op`'s number + 1, `u32::MAX` for a function
    /// (functions cannot be compared), 0 for none.
    pub op: u32,
}

impl Call {
    pub(crate) fn new<T: Element>(kind: Kind, what: &'static str, n: usize, root: u32) -> Call {
        Call {
            kind,
            what,
            seq: 0,
            n,
            size: T::SIZE,
            type_name: T::NAME,
            root,
            op: 0,
        }
    }

    /// The same call with its reduction.
    pub(crate) fn reducing<T: Element>(mut self, r: &Reduction<T>) -> Call {
        self.op = match r {
            Reduction::Op(op) => Op::ALL
                .iter()
                .position(|o| o == op)
                .map_or(u32::MAX - 1, |i| i as u32 + 1),
            Reduction::Custom(_) => u32::MAX,
        };
        self
    }

    pub(crate) fn bytes(&self) -> usize {
        self.n * self.size
    }

    /// Whether its data travels in the slots.
    pub(crate) fn in_place(&self) -> bool {
        self.bytes() <= SLOT_DATA
    }

    fn words(&self, bytes: usize) -> [u64; HEAD_WORDS] {
        [
            self.kind as u64 | u64::from(self.seq) << 32,
            bytes as u64,
            u64::from(self.root) | u64::from(self.op) << 32,
            self.size as u64 | u64::from(name_hash(self.type_name)) << 32,
            0,
            0,
        ]
    }
}

/// A type name's hash (FNV-1a, folded to 32 bits), so ranks compare types.
fn name_hash(name: &str) -> u32 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h ^ h >> 32) as u32
}

/// Why a collective failed here, and the rank that made it fail.
#[derive(Debug)]
pub(crate) struct Differs {
    pub rank: u32,
    pub message: String,
    /// That rank's process is gone (a read of its memory found no such
    /// process): the World has lost it.
    pub gone: bool,
}

/// The slots of every rank of a one-node World, and where this rank is in
/// their protocol.
#[derive(Debug)]
pub(crate) struct NodeColl {
    /// By world rank.
    slots: Vec<Slots>,
    me: usize,
    /// The next collective's number.
    next: u64,
    /// By world rank: its header of the current collective checked.
    seen: Vec<bool>,
    /// The collective `seen` is about.
    seen_for: Option<u64>,
    /// By world rank: its `done` when last loaded. It only grows, so a
    /// post that an old value allows needs no load (which would take the
    /// line back from a rank that writes it every collective).
    known_done: Vec<u64>,
    /// A peer's data, copied out of its slot.
    stage: Vec<u8>,
    /// Whether this rank may read every other rank's memory, asked of the
    /// kernel at the first call larger than a slot (`on_node_copy.rs`).
    readable: Option<bool>,
    /// Whether a wait may spin between turns of the World (a core per
    /// rank on the node).
    pub(crate) spin: bool,
    /// How a wait for the slots passes the time: the World's rule, with
    /// the sleep on the doorbell (`World::wait_on_node`).
    pub(crate) idle: Idler,
}

impl NodeColl {
    /// `slots` by world rank; this rank is `me`; `spin` and `idle` as the
    /// fields.
    pub(crate) fn new(slots: Vec<Slots>, me: u32, spin: bool, idle: Idler) -> NodeColl {
        let n = slots.len();
        NodeColl {
            slots,
            me: me as usize,
            next: 0,
            seen: vec![false; n],
            seen_for: None,
            known_done: vec![0; n],
            stage: vec![0; SLOT_DATA],
            readable: None,
            spin,
            idle,
        }
    }

    /// Number the next collective, and read its headers from now on.
    pub(crate) fn begin(&mut self) -> u64 {
        let k = self.begin_later();
        self.seen.fill(false);
        self.seen[self.me] = true;
        self.seen_for = Some(k);
        k
    }

    /// Number the next collective, to be read once those before it are
    /// done (a non-blocking one, `world/node_requests.rs`).
    pub(crate) fn begin_later(&mut self) -> u64 {
        let k = self.next;
        self.next += 1;
        k
    }

    /// The collective whose headers are being read.
    pub(crate) fn reading(&self) -> Option<u64> {
        self.seen_for
    }

    /// Read the headers of `k`, a `call` this rank (`me`) posted already:
    /// every other rank's, or with `by_kind` those its kind needs (see
    /// [`NodeColl::only`]).
    pub(crate) fn read_call(&mut self, k: u64, call: &Call, me: u32, by_kind: bool) {
        self.seen.fill(false);
        self.seen[self.me] = true;
        self.seen_for = Some(k);
        if !by_kind {
            return;
        }
        match call.kind {
            Kind::Broadcast if me != call.root => self.only(Some(call.root)),
            Kind::Broadcast => self.only(None),
            Kind::Reduce if me != call.root => self.only(None),
            _ => {}
        }
    }

    /// Read only `rank`'s header (and data) of the current collective, or,
    /// with `None`, no other rank's: a broadcast's other ranks need the
    /// root's alone, and its root and a reduce's other ranks nobody's (they
    /// post and go, as MPI's do).
    pub(crate) fn only(&mut self, rank: Option<u32>) {
        for (r, seen) in self.seen.iter_mut().enumerate() {
            *seen = Some(r as u32) != rank;
        }
    }

    /// Whether every other rank is done reading the collective that used
    /// `k`'s slot before.
    pub(crate) fn may_post(&mut self, k: u64) -> bool {
        let Some(before) = k.checked_sub(SLOTS as u64) else {
            return true;
        };
        for (r, s) in self.slots.iter().enumerate() {
            if r != self.me && self.known_done[r] <= before {
                self.known_done[r] = s.done();
                if self.known_done[r] <= before {
                    return false;
                }
            }
        }
        true
    }

    /// Whether a wait for room for `k` may be over: what a sleeper asks
    /// once its doorbell is armed.
    pub(crate) fn room_came(&self, k: u64) -> bool {
        let Some(before) = k.checked_sub(SLOTS as u64) else {
            return true;
        };
        self.others().all(|(_, s)| s.done() > before)
    }

    /// Whether a header of `k` not yet checked has come: the same for a
    /// wait for headers.
    pub(crate) fn header_came(&self, k: u64) -> bool {
        self.slots
            .iter()
            .zip(&self.seen)
            .any(|(s, &seen)| !seen && s.stamp(k) == k + 1)
    }

    fn others(&self) -> impl Iterator<Item = (usize, &Slots)> {
        let me = self.me;
        self.slots.iter().enumerate().filter(move |(r, _)| *r != me)
    }

    /// Post this rank's part of collective `k` and wake the others: its
    /// header (which gives the call's length whether or not this rank's
    /// data travels) and `data`. `at`, where not 0, is the address of this
    /// rank's whole data in its own memory, offered for the others to read
    /// with one copy where it is larger than a slot (`on_node_copy.rs`);
    /// the header then also says whether this rank may read every other
    /// rank's memory.
    pub(crate) fn post(&mut self, k: u64, call: &Call, data: &[u8], at: u64) {
        let mut words = call.words(call.bytes());
        if at != 0 && !call.in_place() {
            words[4] = at;
            words[5] = u64::from(self.may_read_all());
        }
        self.post_words(k, words, data);
    }

    /// Whether this rank may read every other rank's memory: asked once.
    fn may_read_all(&mut self) -> bool {
        let (slots, me) = (&self.slots, self.me);
        *self.readable.get_or_insert_with(|| {
            slots
                .iter()
                .enumerate()
                .all(|(r, s)| r == me || s.owner_readable())
        })
    }

    fn post_words(&self, k: u64, words: [u64; HEAD_WORDS], data: &[u8]) {
        self.slots[self.me].post(k, words, data);
        for (_, s) in self.others() {
            s.ring();
        }
    }

    /// Post a refusal of collective `k` with its reason: the kind says
    /// "refused", with the call's own kind in its second byte.
    pub(crate) fn refuse(&self, k: u64, call: &Call, reason: &str) {
        let reason = super::cut::within(reason, SLOT_DATA);
        let mut words = call.words(reason.len());
        words[0] = Kind::Refused as u64 | (call.kind as u64) << 8 | u64::from(call.seq) << 32;
        self.post_words(k, words, reason.as_bytes());
    }

    /// Check the headers of `k` that came since the last look: `Ok(true)`
    /// once every rank's is in and agrees with `call`, `Ok(false)` while
    /// some are missing (`progress` says whether any new one came).
    pub(crate) fn gather(&mut self, k: u64, call: &Call, progress: &mut bool) -> Result<bool, Differs> {
        let mut all = true;
        for r in 0..self.slots.len() {
            if self.seen[r] {
                continue;
            }
            let stamp = self.slots[r].stamp(k);
            if stamp != k + 1 {
                let earlier = stamp == 0 || (stamp <= k && (k + 1 - stamp) % SLOTS as u64 == 0);
                if !earlier {
                    return Err(self.corrupt(r, k, stamp));
                }
                all = false;
                continue;
            }
            *progress = true;
            self.check(r, k, call)?;
            self.seen[r] = true;
        }
        Ok(all)
    }

    fn corrupt(&self, r: usize, k: u64, stamp: u64) -> Differs {
        Differs {
            rank: r as u32,
            message: format!(
                "rank {r}'s collective slot holds stamp {stamp} where collective {k} (stamp {}) or an \
                 earlier one of its slot belongs: its shared memory was overwritten, or it runs another \
                 fabric-msg",
                k + 1
            ),
            gone: false,
        }
    }

    /// Check rank `r`'s header of `k` against `call`.
    fn check(&mut self, r: usize, k: u64, call: &Call) -> Result<(), Differs> {
        let [w0, bytes, w2, w3, ..] = self.slots[r].head(k);
        let (kind, refused, seq) = (w0 & 0xff, w0 >> 8 & 0xff, (w0 >> 32) as u32);
        let (root, op) = ((w2 & 0xffff_ffff) as u32, (w2 >> 32) as u32);
        let differs = |message: String| Differs {
            rank: r as u32,
            message,
            gone: false,
        };
        if kind == Kind::Refused as u64 {
            let len = (bytes as usize).min(SLOT_DATA);
            self.slots[r].read(k, &mut self.stage[..len]);
            let reason = String::from_utf8_lossy(&self.stage[..len]);
            return Err(differs(format!(
                "rank {r} refused its {}: {reason}",
                Kind::name(refused)
            )));
        }
        let what = call.what;
        if kind != call.kind as u64 || seq != call.seq {
            return Err(differs(another_collective(
                r as u32,
                Kind::name(kind),
                seq,
                what,
                call.seq,
            )));
        }
        let mine = call.words(call.bytes());
        if bytes != mine[1] || w3 != mine[3] {
            let size = (w3 & 0xffff_ffff).max(1);
            let same_type = w3 == mine[3];
            let theirs = if same_type {
                format!("{} × {}", bytes / size, call.type_name)
            } else {
                format!("{size}-byte elements of another type than {}", call.type_name)
            };
            return Err(differs(format!(
                "rank {r} sent {bytes} bytes ({theirs}) to the {what}, where this rank expected {} ({} × {}): \
                 every rank must pass matching lengths (and the same root)",
                call.bytes(),
                call.n,
                call.type_name
            )));
        }
        if root != call.root {
            return Err(differs(format!(
                "rank {r} named root {root} for the {what}, this rank root {}: every rank must pass the same root",
                call.root
            )));
        }
        if op != call.op {
            return Err(differs(format!(
                "rank {r} passed another reduction to the {what} than this rank: every rank must pass the same \
                 reduction"
            )));
        }
        Ok(())
    }

    /// Rank `r`'s data of collective `k` (`len` bytes, which the headers
    /// agreed on and `in_place` bounded).
    pub(crate) fn data(&mut self, k: u64, r: u32, len: usize) -> &[u8] {
        let out = &mut self.stage[..len];
        self.slots[r as usize].read(k, out);
        out
    }

    /// This rank reads nothing more of collective `k`; a rank asleep
    /// waiting for room is woken.
    pub(crate) fn finish(&self, k: u64) {
        self.slots[self.me].set_done(k + 1);
        for (_, s) in self.others() {
            s.ring();
        }
    }

    /// Whether every rank of collective `k` offered its data for one copy
    /// and may read every other rank's (after every header came): the same
    /// answer on every rank, from the same headers.
    pub(crate) fn single_copy(&self, k: u64) -> bool {
        self.slots.iter().all(|s| {
            let head = s.head(k);
            head[4] != 0 && head[5] == 1
        })
    }

    /// Read `dst.len()` bytes of rank `r`'s data of collective `k`, from
    /// byte `offset` on, with one copy (`single_copy` said yes).
    pub(crate) fn read_from(&self, k: u64, r: usize, offset: usize, dst: &mut [u8]) -> Result<(), Differs> {
        let s = &self.slots[r];
        let at = s.head(k)[4].checked_add(offset as u64).unwrap_or(0);
        crate::transport::node::single_copy::read(s.owner_pid(), at, dst).map_err(|errno| {
            // A rank that failed its own part leaves, and its memory with it.
            let left = s.done() > k;
            Differs {
                rank: r as u32,
                gone: errno == libc::ESRCH,
                message: format!(
                    "reading {} bytes of rank {r}'s data from its memory failed: {} ({})",
                    dst.len(),
                    std::io::Error::from_raw_os_error(errno),
                    if left {
                        "it had left the call: its own error says why"
                    } else {
                        "its process is gone, or its shared memory was overwritten"
                    }
                ),
            }
        })
    }

    /// Say that this rank's part of collective `k` is final, and wake the
    /// others.
    pub(crate) fn phase_done(&self, k: u64) {
        self.slots[self.me].set_phase(k);
        for (_, s) in self.others() {
            s.ring();
        }
    }

    /// `Ok(true)` once every other rank's part of `k` is final; an error
    /// names a rank that finished `k` without (it failed its part).
    pub(crate) fn phases(&self, k: u64) -> Result<bool, Differs> {
        let mut all = true;
        for (r, s) in self.others() {
            if s.phase(k) {
                continue;
            }
            // Done without its phase: it left early. The phase is looked at
            // again after `done` (Acquire), since it may have come, then
            // `done`, between the two loads above.
            if s.done() > k && !s.phase(k) {
                return Err(Differs {
                    rank: r as u32,
                    message: format!(
                        "rank {r} left the call before its part was done (its own error says why)"
                    ),
                    gone: false,
                });
            }
            all = false;
        }
        Ok(all)
    }

    /// Whether every other rank is done with collective `k`: no one reads
    /// this rank's memory any more.
    pub(crate) fn all_done(&self, k: u64) -> bool {
        self.others().all(|(_, s)| s.done() > k)
    }

    /// Collectives begun here so far.
    #[cfg(test)]
    pub(crate) fn begun(&self) -> u64 {
        self.next
    }

    pub(crate) fn size(&self) -> u32 {
        self.slots.len() as u32
    }

    /// This rank's rank in the slots' communicator.
    pub(crate) fn me(&self) -> u32 {
        self.me as u32
    }
}

/// Fold every rank's data of collective `k` into `data` in rank order:
/// `data` becomes rank 0's, then each next rank's is combined in. This
/// rank's own contribution is read back from its own slot, where it was
/// posted, like any other rank's. Every rank computes the same expression,
/// so every rank gets the same bits; nothing is allocated (`scratch` is
/// used only by a function reduction).
pub(crate) fn fold_in_rank_order<T: Element>(
    nc: &mut NodeColl,
    k: u64,
    data: &mut [T],
    reduction: &Reduction<T>,
    scratch: &mut Vec<T>,
) {
    let len = std::mem::size_of_val(data);
    T::read(nc.data(k, 0, len), data);
    for r in 1..nc.size() {
        let other = nc.data(k, r, len);
        reduction.combine_bytes(data, other, false, scratch);
    }
}
