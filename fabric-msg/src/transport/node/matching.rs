//! Which receive a message from a same-node rank goes to: the receives
//! posted and the messages that arrived before any receive matched them,
//! each in order, as MPI orders them (a message goes to the oldest posted
//! receive that matches it; a receive takes the oldest arrived message
//! that matches it; so two messages from one rank that both match a
//! receive are never taken out of order).
//!
//! A message that arrives unexpected is copied out of the ring into a
//! buffer from a pool (the ring must be freed for the messages behind it);
//! a receive that matches one still arriving claims it and completes when
//! its last frame is in. A receive posted before its message (the common
//! case in a loop that posts first) takes the bytes straight from the
//! ring.
//!
//! A receive can be **paired** with another that waits on another loop
//! for the same message (the World's receive from any rank, whose other
//! part is on the fabric): before a message goes to it, the loop asks its
//! owner ([`Match::Ask`]) and leaves the message where it is until the
//! owner answers, by taking the receive back or by unpairing it
//! (`world/local/claims.rs`). So the pair's fate is settled before any
//! other message is matched: a message is never given to a receive that
//! the other loop has already satisfied.

use super::lent::Mem;
use crate::transport::event_loop::Token;
use std::collections::VecDeque;

/// A receive the application posted.
#[derive(Debug)]
pub struct Posted {
    /// Its token.
    pub token: Token,
    /// Only from this rank (node index), or from any.
    pub from: Option<usize>,
    /// `(tag, ignore)`: bits set in `ignore` are not compared.
    pub tag: (u64, u64),
    /// Where the message goes; its length is set on completion.
    pub(crate) buf: Mem,
    /// Its owner must say whether it may take a message (module docs).
    pub paired: bool,
}

/// What the oldest posted receive a message matches says.
#[derive(Debug)]
pub enum Match {
    /// This receive takes it.
    Take(Posted),
    /// No posted receive matches it.
    None,
    /// The first that matches is paired: its owner must answer first (the
    /// receive's token is in [`Matcher::take_asked`]).
    Ask,
}

impl Posted {
    /// Whether a message from `from` with `tag` goes to this receive.
    #[inline]
    pub fn matches(&self, from: usize, tag: u64) -> bool {
        self.from.map_or(true, |f| f == from) && (tag ^ self.tag.0) & !self.tag.1 == 0
    }
}

/// A message that arrived before a receive for it.
#[derive(Debug)]
pub struct Arrived {
    /// Its sender (node index).
    pub from: usize,
    /// Its tag.
    pub tag: u64,
    /// Its length.
    pub total: usize,
    /// What has arrived of it.
    pub data: Vec<u8>,
    /// All of it is in.
    pub complete: bool,
    /// A receive that matched it while it was still arriving.
    pub claimed: Option<Posted>,
    /// A large message still in the sender's memory: its address there
    /// and the send's number (`single_copy`); `data` stays empty.
    pub rndv: Option<(u64, u64)>,
}

/// A receive matched to an announced far message: its data is to be
/// fetched into `posted`'s memory.
#[derive(Debug)]
pub(crate) struct FarMatch {
    pub(crate) posted: Posted,
    /// The message's tag and length.
    pub(crate) tag: u64,
    pub(crate) total: usize,
    /// What the World needs to fetch it (the announcement's number).
    pub(crate) ticket: u64,
}

/// The receives posted and the messages arrived, each oldest first.
#[derive(Debug, Default)]
pub struct Matcher {
    posted: VecDeque<Posted>,
    arrived: VecDeque<Arrived>,
    /// Buffers for unexpected messages, kept for the next ones.
    pool: Vec<Vec<u8>>,
    /// Paired receives a message waits for an answer about.
    asked: Vec<Token>,
    /// Receives matched to announced far messages (`far.rs`), until their
    /// owner takes them.
    pub(crate) far: Vec<FarMatch>,
}

impl Matcher {
    /// The oldest posted receive a message from `from` with `tag` goes to,
    /// unless it is paired.
    #[inline]
    pub fn take_posted(&mut self, from: usize, tag: u64) -> Match {
        // The usual case, a loop that posts its receives in the order its
        // messages come: the oldest posted receive takes it, and leaves
        // from the front without a search or a shift of the others.
        if self.front_for(from, tag).is_some() {
            return self.pop_front().map_or(Match::None, Match::Take);
        }
        let Some(i) = self.posted.iter().position(|p| p.matches(from, tag)) else {
            return Match::None;
        };
        if self.posted[i].paired {
            let t = self.posted[i].token;
            if !self.asked.contains(&t) {
                self.asked.push(t);
            }
            return Match::Ask;
        }
        self.posted.remove(i).map_or(Match::None, Match::Take)
    }

    /// The oldest posted receive, if a message from `from` with `tag` goes
    /// to it without a question (it matches and is not paired): the usual
    /// case, whose bytes are then copied in place before
    /// [`Matcher::pop_front`] takes it out.
    #[inline]
    pub fn front_for(&mut self, from: usize, tag: u64) -> Option<&mut Posted> {
        self.posted
            .front_mut()
            .filter(|p| !p.paired && p.matches(from, tag))
    }

    /// Take out the oldest posted receive.
    #[inline]
    pub fn pop_front(&mut self) -> Option<Posted> {
        self.posted.pop_front()
    }

    /// The paired receives asked about since the last call (into `out`).
    pub fn take_asked(&mut self, out: &mut Vec<Token>) {
        out.append(&mut self.asked);
    }

    /// Whether a message waits for an answer about a paired receive.
    pub fn asks(&self) -> bool {
        !self.asked.is_empty()
    }

    /// The paired receive `token` may take messages like any other: its
    /// other part was taken back. False if no such receive is posted.
    pub fn unpair(&mut self, token: Token) -> bool {
        self.asked.retain(|t| *t != token);
        match self.posted.iter_mut().find(|p| p.token == token) {
            Some(p) => {
                p.paired = false;
                true
            }
            None => false,
        }
    }

    /// Keep a receive no arrived message matches.
    pub fn post(&mut self, p: Posted) {
        self.posted.push_back(p);
    }

    /// The index of the oldest arrived, unclaimed message `p` matches.
    pub fn find_arrived(&self, p: &Posted) -> Option<usize> {
        if self.arrived.is_empty() {
            return None;
        }
        self.arrived
            .iter()
            .position(|a| a.claimed.is_none() && p.matches(a.from, a.tag))
    }

    /// The tag and length of the oldest arrived, unclaimed message whose
    /// tag matches `tag` outside `ignore` (a probe's look).
    pub fn peek(&self, tag: u64, ignore: u64) -> Option<(u64, usize)> {
        self.arrived
            .iter()
            .find(|a| a.claimed.is_none() && a.tag & !ignore == tag & !ignore)
            .map(|a| (a.tag, a.total))
    }

    /// Start an unexpected message of `total` bytes; its index. Fails
    /// (without aborting the process) when the memory cannot be had.
    pub fn start_arrived(&mut self, from: usize, tag: u64, total: usize) -> Result<usize, String> {
        let mut data = self.pool.pop().unwrap_or_default();
        data.clear();
        data.try_reserve_exact(total)
            .map_err(|e| format!("no memory to hold an unexpected message of {total} bytes: {e}"))?;
        self.arrived.push_back(Arrived {
            from,
            tag,
            total,
            data,
            complete: false,
            claimed: None,
            rndv: None,
        });
        Ok(self.arrived.len() - 1)
    }

    /// Keep a request to read a large message from its sender's memory,
    /// which no receive matched yet.
    pub fn keep_request(&mut self, from: usize, tag: u64, total: usize, at: (u64, u64)) {
        let data = Vec::new();
        self.arrived.push_back(Arrived {
            from,
            tag,
            total,
            data,
            complete: true,
            claimed: None,
            rndv: Some(at),
        });
    }

    /// The arrived message at `i`.
    pub fn arrived_mut(&mut self, i: usize) -> &mut Arrived {
        &mut self.arrived[i]
    }

    /// Take the arrived message at `i` out of the list.
    pub fn remove_arrived(&mut self, i: usize) -> Arrived {
        self.arrived.remove(i).expect("index of an arrived message")
    }

    /// Give an unexpected message's buffer back for reuse.
    pub fn recycle(&mut self, data: Vec<u8>) {
        if self.pool.len() < 64 {
            self.pool.push(data);
        }
    }

    /// Take back the receive posted with `token` (not a lent one: the
    /// collectives that lend memory never take a receive back).
    pub fn cancel(&mut self, token: Token) -> Option<Posted> {
        let i = self
            .posted
            .iter()
            .position(|p| p.token == token && !p.buf.is_lent())?;
        self.asked.retain(|t| *t != token);
        self.posted.remove(i)
    }

    /// Take back every posted receive for exactly rank `from` (never one
    /// handed over to fetch a far message: that one is the owner's).
    pub fn cancel_from(&mut self, from: usize) -> Vec<Posted> {
        let mut gone = Vec::new();
        for p in std::mem::take(&mut self.posted) {
            if p.from == Some(from) {
                gone.push(p);
            } else {
                self.posted.push_back(p);
            }
        }
        gone
    }

    /// Forget an unexpected message from `from` that will never be whole.
    pub fn drop_arriving_from(&mut self, from: usize) {
        if let Some(i) = self.arriving_from(from) {
            let a = self.remove_arrived(i);
            self.recycle(a.data);
        }
    }

    /// Receives posted and not matched; messages kept unexpected.
    pub fn counts(&self) -> (usize, usize) {
        (self.posted.len(), self.arrived.len())
    }

    /// The index of the message from `from` still arriving, if any.
    pub fn arriving_from(&self, from: usize) -> Option<usize> {
        self.arrived.iter().rposition(|a| a.from == from && !a.complete)
    }
}
