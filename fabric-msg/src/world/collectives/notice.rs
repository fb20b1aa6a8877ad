//! Notices on the wire: a rank whose collective failed tells the others
//! (`engine.rs`, `notify`), and a rank whose collective has waited long
//! tells the ranks it waits for which collective it is in (a probe,
//! `probe.rs`). Every notice from rank `r` has the one
//! tag `tags::notice_tag(r)`, so a rank can take them with exact receives
//! where masked ones misbehave (libfabric 1.17's shm); which communicator
//! and which collective travel in the notice's head, checked here before
//! anything is believed.

use super::io::{post_outgoing, token, Io, Kind, Outgoing, Shared, NOTICE_MAX, NOTICE_PATIENCE};
use super::scope::Scope;
use crate::error::Result;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::RecvOpts;
use crate::world::tags;
use std::time::Instant;

/// The notice receive's index on the main loop, and on the shm loop.
const MAIN: u32 = 0;
const SHM: u32 = 1;

/// A failure another rank told of.
#[derive(Debug)]
pub(super) struct Notice {
    /// The communicator's context, and the collective's number in it.
    pub(super) ctx: u8,
    pub(super) seq: u32,
    pub(super) rank: u32,
    /// A failure's text, or a probe's collective (`probe.rs`).
    pub(super) text: String,
    pub(super) probe: bool,
}

/// A notice's head: the communicator's context (1 byte, with `PROBE` set
/// in a probe) and the collective's number (4 bytes, little-endian); its
/// text follows.
pub(crate) const NOTICE_HEAD: usize = 5;

/// The bit of the context byte that makes a notice a probe (contexts stay
/// below `tags::MAX_CONTEXTS`, 64).
const PROBE: u8 = 0x80;

/// The token index of a notice receive on `lane` from `from` (or any rank).
pub(crate) fn notice_index(lane: u32, from: Option<u32>) -> u32 {
    lane | from.map_or(0, |r| (r + 1) << 1)
}

/// The lane and rank of a notice receive's token index.
pub(crate) fn notice_lane(index: u32) -> (u32, Option<u32>) {
    (index & 1, (index >> 1).checked_sub(1))
}

/// A notice from `rank`: its context, collective number, text and whether
/// it is a probe; `None` if it is too short or names a context that cannot
/// exist.
pub(super) fn decode_notice(b: &[u8], rank: u32) -> Option<Notice> {
    let (&head, rest) = b.split_first()?;
    let ctx = head & !PROBE;
    if u32::from(ctx) >= tags::MAX_CONTEXTS || rest.len() < NOTICE_HEAD - 1 {
        return None;
    }
    let seq = u32::from_le_bytes(rest[..4].try_into().ok()?) & tags::SEQ_MASK;
    Some(Notice {
        ctx,
        seq,
        rank,
        text: String::from_utf8_lossy(&rest[4..]).into_owned(),
        probe: head & PROBE != 0,
    })
}

/// Write a notice (a probe if `probe`) about collective `seq` of context
/// `ctx` with `text` into `b`, which holds exactly `NOTICE_HEAD +
/// text.len()` bytes.
pub(super) fn encode_notice(b: &mut [u8], ctx: u8, seq: u32, probe: bool, text: &str) {
    b[0] = if probe { ctx | PROBE } else { ctx };
    b[1..NOTICE_HEAD].copy_from_slice(&seq.to_le_bytes());
    b[NOTICE_HEAD..].copy_from_slice(text.as_bytes());
}

/// The notices this rank heard and has yet to apply, and those it has
/// yet to post.
#[derive(Debug, Default)]
pub(super) struct Notices {
    /// Heard, not yet applied (or kept for a collective not yet begun).
    pub(super) heard: Vec<Notice>,
    /// To post, with their collective and when to give up.
    pub(super) out: Vec<(Outgoing, u32, Instant)>,
    /// Whether the receives for notices are posted.
    pub(super) posted: bool,
    /// Numbers taken for a collective that starts later (a leaders' step
    /// of a call in two levels: `world/two_level_chain.rs`), by context:
    /// notices about them are kept until it starts, as for one not begun.
    pub(super) reserved: Vec<(u8, u32)>,
}

impl Notices {
    /// Whether `n` is about a number taken for a collective not started.
    pub(super) fn for_reserved(&self, n: &Notice) -> bool {
        self.reserved
            .iter()
            .any(|&(ctx, seq)| (ctx, seq) == (n.ctx, n.seq))
    }

    /// The collective `seq` of context `ctx` starts (or is refused).
    pub(super) fn unreserve(&mut self, ctx: u8, seq: u32) {
        self.reserved.retain(|&r| r != (ctx, seq & tags::SEQ_MASK));
    }

    /// Post the receives for failure notices (once; not in a world of
    /// one): one masked receive per loop, or, on a loop whose provider
    /// matches masked receives wrongly (libfabric 1.17's shm:
    /// `Profile::tag_mask_defect`), one exact receive per rank that sends
    /// there, so that no masked receive ever poisons the exact receives of
    /// the collectives and the application (a barrier's receive was given
    /// another rank's message in 1 of 4 runs of `model_check` with the
    /// masked notice receive).
    pub(crate) fn listen(&mut self, io: &mut Io<'_>) -> Result<()> {
        if self.posted || io.peers.len() < 2 {
            return Ok(());
        }
        let shm_ranks = io.local.as_ref().map(|l| l.ranks()).unwrap_or_default();
        let main_ranks: Vec<u32> = (0..io.peers.len() as u32)
            .filter(|r| *r != io.rank && !shm_ranks.contains(r))
            .collect();
        for (lane, ranks) in [(MAIN, main_ranks), (SHM, shm_ranks)] {
            if ranks.is_empty() {
                // No rank's notices come over this loop (the main one, where
                // the node loop carries every rank).
                continue;
            }
            let exact = match (lane, io.local.as_ref()) {
                (SHM, Some(l)) => l.side.exact_only(),
                (SHM, None) => continue,
                _ => io.ev.profile().tag_mask_defect.is_some(),
            };
            if !exact {
                self.post_recv(io, Buffer::new(NOTICE_MAX), lane, None)?;
                continue;
            }
            for r in ranks {
                self.post_recv(io, Buffer::new(NOTICE_MAX), lane, Some(r))?;
            }
        }
        Ok(())
    }

    /// Post the receive for notices on the main loop (`MAIN`) or, for
    /// ranks on this node, the shared-memory loop (`SHM`); each is posted
    /// again on its own loop.
    /// `from`: the one rank it takes notices from (an exact receive), or
    /// any rank (masked). The token's index says both (`notice_index`).
    pub(super) fn post_recv(
        &mut self,
        io: &mut Io<'_>,
        buf: Buffer,
        lane: u32,
        from: Option<u32>,
    ) -> Result<()> {
        let opts = RecvOpts {
            tag: Some(from.map_or(tags::notice_matcher(), |r| (tags::notice_tag(r), 0))),
            from: None,
        };
        let t = token(Kind::NoticeRecv, 0, notice_index(lane, from));
        match (lane, io.local.as_mut()) {
            (SHM, Some(l)) => l
                .side
                .post(tags::CLASS_WORLD, opts.tag.unwrap_or_default(), buf, t)?,
            _ => io.ev.as_world().recv(io.ep, buf, opts, t)?,
        }
        self.posted = true;
        Ok(())
    }

    /// Tell every other rank of `scope` that its collective `seq` failed
    /// here. The notices go out from `Engine::progress`, best effort,
    /// for at most `NOTICE_PATIENCE`.
    pub(super) fn notify(
        &mut self,
        io: &mut Io<'_>,
        sh: &mut Shared,
        scope: &Scope,
        seq: u32,
        message: &str,
    ) {
        let peers = scope.others(io.rank, io.peers.len() as u32);
        self.send(io, sh, scope.ctx, seq, &peers, false, message);
    }

    /// Queue a notice (a probe if `probe`) about collective `seq` of
    /// context `ctx` for each of `peers`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send(
        &mut self,
        io: &mut Io<'_>,
        sh: &mut Shared,
        ctx: u8,
        seq: u32,
        peers: &[u32],
        probe: bool,
        message: &str,
    ) {
        let text = super::cut::within(message, NOTICE_MAX - NOTICE_HEAD);
        let tag = tags::notice_tag(io.rank);
        let until = Instant::now() + NOTICE_PATIENCE;
        for &peer in peers {
            let mut buf = sh.pool.take(NOTICE_HEAD + text.len());
            encode_notice(buf.as_mut_slice(), ctx, seq, probe, text);
            let o = Outgoing {
                peer,
                tag,
                buf,
                inject: false,
            };
            self.out.push((o, seq, until));
        }
    }

    /// Post the notices still to go.
    pub(super) fn flush(&mut self, io: &mut Io<'_>, sh: &mut Shared) {
        if self.out.is_empty() {
            return;
        }
        let now = Instant::now();
        for (o, seq, until) in std::mem::take(&mut self.out) {
            let peer = o.peer;
            match post_outgoing(io, sh, o, token(Kind::NoticeSend, seq, 0)) {
                Ok(None) => {}
                Ok(Some(o)) if now < until => self.out.push((o, seq, until)),
                Ok(Some(_)) => {
                    log::warn!(peer = peer, op = "collective", collective = seq; "rank {peer} took no notice about collective #{seq}")
                }
                Err(f) => log::warn!(
                    peer = peer, op = "collective", collective = seq;
                    "cannot tell rank {peer} about collective #{seq}: {}",
                    f.message
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_malformed_ones_are_refused() {
        let text = "rank 3 passed BitXor";
        let mut b = vec![0u8; NOTICE_HEAD + text.len()];
        for probe in [false, true] {
            encode_notice(&mut b, 5, 77, probe, text);
            let n = decode_notice(&b, 3).expect("a notice");
            assert_eq!(
                (n.ctx, n.seq, n.rank, n.text.as_str(), n.probe),
                (5, 77, 3, text, probe)
            );
        }
        assert!(decode_notice(&[], 0).is_none(), "empty");
        assert!(
            decode_notice(&b[..NOTICE_HEAD - 1], 0).is_none(),
            "no whole number"
        );
        let n = decode_notice(&b[..NOTICE_HEAD], 0).expect("no text");
        assert_eq!((n.ctx, n.seq, n.text.as_str()), (5, 77, ""));
        for bad in [tags::MAX_CONTEXTS as u8, tags::MAX_CONTEXTS as u8 | PROBE] {
            b[0] = bad;
            assert!(
                decode_notice(&b, 0).is_none(),
                "a context that cannot exist: {bad:#x}"
            );
        }
        b[0] = 0;
        b[1..NOTICE_HEAD].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_notice(&b, 0).map(|n| n.seq),
            Some(tags::SEQ_MASK),
            "numbers wrap as the World's do"
        );
    }

    #[test]
    fn a_receives_token_index_names_its_lane_and_rank() {
        for lane in [0, 1] {
            assert_eq!(notice_lane(notice_index(lane, None)), (lane, None));
            for r in [0, 1, 4095, (1 << 24) - 1] {
                assert_eq!(notice_lane(notice_index(lane, Some(r))), (lane, Some(r)));
            }
        }
    }
}
