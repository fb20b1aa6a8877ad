//! What arrives on the same-node rings: frames read into the receives
//! they match (straight from the ring, or kept unexpected), requests to
//! read a large message from its sender (`single_copy`), the acks that
//! complete such sends, and the failures: a corrupt ring, a failed read,
//! a lost rank's operations.

use super::matching::{Arrived, Match, Posted};
use super::node_loop::{Assembly, Into, NodeLoop, Outgoing};
use super::ring::{Frame, ACK, FIRST, LAST, RNDV};
use super::single_copy::{self, ACK_LEN, REQUEST_LEN};
use crate::transport::event_loop::{CompletionError, OpKind};

/// Frames read from one ring per poll at most, so that one busy sender
/// does not starve the others or the sends.
const FRAMES_PER_POLL: usize = 64;

impl NodeLoop {
    /// Read what `s` has written to us.
    pub(super) fn drain(&mut self, s: usize) {
        for _ in 0..FRAMES_PER_POLL {
            let f = match self.inbox[s].peek() {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => return self.break_peer(s, e.to_string()),
            };
            let taken = if f.flags & ACK != 0 {
                self.acked(s, &f).map(|()| true)
            } else {
                self.take(s, &f)
            };
            match taken {
                Err(what) => return self.break_peer(s, what),
                // A paired receive's owner must answer first: the frame
                // stays where it is, and so do the ones behind it.
                Ok(false) => return,
                Ok(true) => self.inbox[s].consume(&f),
            }
        }
    }

    /// Deliver frame `f` from `s`: false if it must wait (a paired
    /// receive is asked about, `matching.rs`) and stays in the ring.
    fn take(&mut self, s: usize, f: &Frame) -> std::result::Result<bool, String> {
        // The common small message: whole in one frame, for a posted
        // receive, straight into its buffer.
        if f.flags == FIRST | LAST && f.len as u64 == f.total && self.assembling[s].is_none() {
            if let Some(p) = self.matcher.front_for(s, f.tag) {
                let n = f.len.min(p.buf.capacity());
                self.inbox[s].copy_out(f, 0, &mut p.buf.as_mut_slice()[..n]);
                let p = self.matcher.pop_front().expect("the front was there");
                self.complete_recv(p, s, f.tag, f.total);
                return Ok(true);
            }
            match self.matcher.take_posted(s, f.tag) {
                Match::Take(mut p) => {
                    let n = f.len.min(p.buf.capacity());
                    self.inbox[s].copy_out(f, 0, &mut p.buf.as_mut_slice()[..n]);
                    self.complete_recv(p, s, f.tag, f.total);
                    return Ok(true);
                }
                Match::Ask => return Ok(false),
                Match::None => {}
            }
        }
        let mut a = match self.assembling[s].take() {
            None if f.flags & FIRST == 0 => {
                return Err("a frame continues a message that never started".into())
            }
            None if f.flags & RNDV != 0 => {
                let mut req = [0u8; REQUEST_LEN];
                self.inbox[s].copy_out(f, 0, &mut req);
                let at = single_copy::decode(&req);
                let total =
                    usize::try_from(f.total).map_err(|_| format!("a message of {} bytes", f.total))?;
                match self.matcher.take_posted(s, f.tag) {
                    Match::Take(p) => self.fetch(s, p, f.tag, f.total, at),
                    Match::None => self.matcher.keep_request(s, f.tag, total, at),
                    Match::Ask => return Ok(false),
                }
                return Ok(true);
            }
            None => {
                let total =
                    usize::try_from(f.total).map_err(|_| format!("a message of {} bytes", f.total))?;
                let into = match self.matcher.take_posted(s, f.tag) {
                    Match::Take(p) => Into::Posted(p),
                    Match::None => {
                        self.matcher.start_arrived(s, f.tag, total)?;
                        Into::Arrived
                    }
                    Match::Ask => return Ok(false),
                };
                Assembly {
                    tag: f.tag,
                    total: f.total,
                    got: 0,
                    into,
                }
            }
            Some(_) if f.flags & FIRST != 0 => return Err("a message started inside another".into()),
            Some(a) if (a.tag, a.total) != (f.tag, f.total) => {
                return Err(format!(
                    "a frame of a message (tag {:#x}, {} bytes) inside another (tag {:#x}, {} bytes)",
                    f.tag, f.total, a.tag, a.total
                ))
            }
            Some(a) => a,
        };
        let at = a.got as usize;
        if a.got + f.len as u64 > a.total || (f.flags & LAST != 0) != (a.got + f.len as u64 == a.total) {
            return Err(format!(
                "frames of {} bytes at {at} of a {}-byte message, flags {:#x}",
                f.len, a.total, f.flags
            ));
        }
        match &mut a.into {
            Into::Posted(p) => {
                let cap = p.buf.capacity();
                if at < cap {
                    let n = f.len.min(cap - at);
                    self.inbox[s].copy_out(f, 0, &mut p.buf.as_mut_slice()[at..at + n]);
                }
            }
            Into::Arrived => {
                let i = self
                    .matcher
                    .arriving_from(s)
                    .expect("an unexpected message from s is arriving");
                let data = &mut self.matcher.arrived_mut(i).data;
                data.resize(at + f.len, 0);
                self.inbox[s].copy_out(f, 0, &mut data[at..]);
            }
        }
        a.got += f.len as u64;
        if f.flags & LAST == 0 {
            self.assembling[s] = Some(a);
            return Ok(true);
        }
        match a.into {
            Into::Posted(p) => self.complete_recv(p, s, a.tag, a.total),
            Into::Arrived => {
                let i = self.matcher.arriving_from(s).expect("arriving");
                let m = self.matcher.arrived_mut(i);
                m.complete = true;
                if m.claimed.is_some() {
                    let mut m = self.matcher.remove_arrived(i);
                    let p = m.claimed.take().expect("claimed");
                    self.deliver_arrived(p, m);
                }
            }
        }
        Ok(true)
    }

    /// Give receive `p` the whole message `a` that arrived before it: a
    /// copy of what was kept, or a read from the sender's memory.
    pub(super) fn deliver_arrived(&mut self, p: Posted, a: Arrived) {
        match a.rndv {
            // An announced far message's data is the World's to fetch.
            Some((_, ticket)) if a.from == super::far::FAR => self.deliver_far(p, a.tag, a.total, ticket),
            Some(at) => self.fetch(a.from, p, a.tag, a.total as u64, at),
            None => {
                // Complete: every byte of it is kept (`take` refuses
                // frames beyond its length).
                debug_assert_eq!(a.data.len(), a.total);
                self.deliver_whole(p, a.from, a.tag, &a.data);
                self.matcher.recycle(a.data);
            }
        }
    }

    /// Copy the whole message `data` (from `from`, tag `tag`) into receive
    /// `p`, as much as it holds, and complete it: truncated if it held
    /// less.
    pub(super) fn deliver_whole(&mut self, mut p: Posted, from: usize, tag: u64, data: &[u8]) {
        let n = data.len().min(p.buf.capacity());
        p.buf.as_mut_slice()[..n].copy_from_slice(&data[..n]);
        self.complete_recv(p, from, tag, data.len() as u64);
    }

    /// Read a large message of `total` bytes from `s`'s memory at `at.0`
    /// into `p`, and ack send `at.1`.
    pub(super) fn fetch(&mut self, s: usize, mut p: Posted, tag: u64, total: u64, at: (u64, u64)) {
        let n = (total as usize).min(p.buf.capacity());
        let read = single_copy::read(self.pids[s], at.0, &mut p.buf.as_mut_slice()[..n]);
        let ack = single_copy::encode(at.1, u64::from(read.err().unwrap_or(0).unsigned_abs()));
        let sent = self.acks[s].is_empty()
            && self.outbox[s]
                .as_mut()
                .is_some_and(|o| o.try_write(0, ACK, 0, &ack));
        if !sent {
            self.acks[s].push_back(ack);
        }
        match read {
            Ok(()) => self.complete_recv(p, s, tag, total),
            Err(errno) => self.fail_recv(p, s, tag, CompletionError::CopyFailed { peer: s, errno }),
        }
    }

    /// An ack from `s`: the send it names is done.
    fn acked(&mut self, s: usize, f: &Frame) -> std::result::Result<(), String> {
        let mut ack = [0u8; ACK_LEN];
        self.inbox[s].copy_out(f, 0, &mut ack);
        let (id, errno) = single_copy::decode(&ack);
        let Some((peer, o)) = self.waiting.take(id) else {
            return Err(format!("an ack for send {id:#x}, which does not wait"));
        };
        if peer != s {
            let what = format!("an ack from rank {s} for a send to rank {peer}");
            let e = CompletionError::CorruptRing {
                peer: s,
                what: what.clone(),
            };
            self.finish_send(peer, o, Err(e));
            return Err(what);
        }
        let result = match errno {
            0 => Ok(()),
            e => Err(CompletionError::CopyFailed {
                peer: s,
                errno: i32::try_from(e).unwrap_or(libc::EIO),
            }),
        };
        self.finish_send(peer, o, result);
        Ok(())
    }

    /// A send is done (its buffer goes back with `result`).
    pub(super) fn finish_send(
        &mut self,
        peer: usize,
        o: Outgoing,
        result: std::result::Result<(), CompletionError>,
    ) {
        self.done
            .push((o.token, OpKind::Send), o.buf, (peer, o.tag), result);
    }

    /// A receive failed: nothing of the message (tag `tag`) is delivered.
    pub(super) fn fail_recv(&mut self, mut p: Posted, peer: usize, tag: u64, e: CompletionError) {
        p.buf.set_len(0);
        self.done
            .push((p.token, OpKind::Recv), p.buf, (peer, tag), Err(e));
    }

    /// Read every frame `s` has written (its process is gone: nothing
    /// more comes). False if a frame waits for an answer about a paired
    /// receive (`matching.rs`): the rest is read at a later call.
    pub(super) fn read_all_from(&mut self, s: usize) -> bool {
        while self.broken[s].is_none() && self.inbox[s].peek().is_ok_and(|f| f.is_some()) {
            if self.matcher.asks() {
                return false;
            }
            self.drain(s);
        }
        true
    }

    /// The receive the message `s` was in the middle of was going to.
    pub(super) fn assembling_into(&mut self, s: usize) -> Option<Posted> {
        match self.assembling[s].take()?.into {
            Into::Posted(p) => Some(p),
            Into::Arrived => self
                .matcher
                .arriving_from(s)
                .and_then(|i| self.matcher.remove_arrived(i).claimed),
        }
    }

    pub(super) fn complete_recv(&mut self, mut p: Posted, from: usize, tag: u64, total: u64) {
        let cap = p.buf.capacity();
        let result = if total > cap as u64 {
            Err(CompletionError::Truncated {
                message_len: Some(total as usize),
                buffer_len: cap,
            })
        } else {
            Ok(())
        };
        p.buf.set_len((total as usize).min(cap));
        self.done
            .push((p.token, OpKind::Recv), p.buf, (from, tag), result);
    }

    /// Stop reading `s`'s ring; fail the receive it was filling.
    fn break_peer(&mut self, s: usize, what: String) {
        log::error!("same-node rank {s} (to rank {} on the node): {what}", self.me);
        if let Some(Assembly {
            into: Into::Posted(p),
            tag,
            ..
        }) = self.assembling[s].take()
        {
            let e = CompletionError::CorruptRing {
                peer: s,
                what: what.clone(),
            };
            self.fail_recv(p, s, tag, e);
        }
        self.broken[s] = Some(what);
    }
}
