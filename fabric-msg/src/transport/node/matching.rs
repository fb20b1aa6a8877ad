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

/// The receives posted and the messages arrived, each oldest first.
#[derive(Debug, Default)]
pub struct Matcher {
    posted: VecDeque<Posted>,
    arrived: VecDeque<Arrived>,
    /// Buffers for unexpected messages, kept for the next ones.
    pool: Vec<Vec<u8>>,
}

impl Matcher {
    /// The oldest posted receive a message from `from` with `tag` goes to.
    #[inline]
    pub fn take_posted(&mut self, from: usize, tag: u64) -> Option<Posted> {
        let i = self.posted.iter().position(|p| p.matches(from, tag))?;
        self.posted.remove(i)
    }

    /// Keep a receive no arrived message matches.
    pub fn post(&mut self, p: Posted) {
        self.posted.push_back(p);
    }

    /// The index of the oldest arrived, unclaimed message `p` matches.
    pub fn find_arrived(&self, p: &Posted) -> Option<usize> {
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
        self.posted.remove(i)
    }

    /// Take back every posted receive for exactly rank `from`.
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
