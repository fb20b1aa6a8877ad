//! The loop's side of peer loss (`lost_peers.rs` keeps the record): a
//! lifeline to watch per peer, the lifelines' verdicts taken each `poll`,
//! the operations addressed to a lost peer failed (after the grace on RDM
//! endpoints), and a lost peer's connection closed (on MSG endpoints).

use super::lost_peers::Watched;
use super::slab;
use super::slab::NO_GROUP;
use super::state::EventLoop;
use super::types::{Completion, CompletionError, OpKind, Peer, Token};
use crate::error::{Error, Result};
use crate::ffi;
use crate::transport::liveness::{Lifelines, Loss, LossKind, LOSS_GRACE};
use std::net::TcpStream;
use std::time::Instant;

impl EventLoop {
    /// Keep `lifeline`, the bootstrap connection to `peer` (at `label`), as
    /// the channel its death or stall is noticed on.
    pub(crate) fn watch_peer(&mut self, peer: &Peer, lifeline: TcpStream, label: String) -> Result<()> {
        let io = |e: std::io::Error| Error::Io {
            context: format!("keeping the connection to {label} as its lifeline"),
            source: e,
        };
        if self.lost.lifelines.is_none() {
            let alarm = self.lost.alarm.clone();
            self.lost.lifelines = Some(Lifelines::start(self.cfg.peer_timeout, alarm).map_err(io)?);
        }
        let lifelines = self.lost.lifelines.as_mut().expect("started above");
        let id = lifelines.add(lifeline, label.clone()).map_err(io)?;
        self.lost.watched.push(Watched {
            id,
            endpoint: peer.endpoint.0,
            addr: peer.addr,
            label,
            lost: None,
        });
        Ok(())
    }

    /// The peers this loop's lifelines find lost (dead, silent or giving
    /// this process up; not those that depart), readable from any thread:
    /// for a watchdog that must act while the polling thread is stuck
    /// inside libfabric after a loss (see
    /// [`LossAlarm`](crate::transport::liveness::LossAlarm)). `poll`
    /// reports the same losses as [`OpKind::PeerLost`] notices.
    pub fn loss_alarm(&self) -> crate::transport::liveness::LossAlarm {
        self.lost.alarm.clone()
    }

    /// The error of an operation addressed to a lost peer.
    pub(super) fn lost_failure(&self, index: u32) -> CompletionError {
        let s = &self.slab.slots[index as usize];
        let w = self
            .lost
            .watched
            .iter()
            .find(|w| w.endpoint == s.endpoint && w.addr == s.peer);
        CompletionError::PeerLost {
            peer: w.map_or_else(|| "?".to_string(), |w| w.label.clone()),
            how: w.and_then(|w| w.lost).unwrap_or(LossKind::Died),
        }
    }

    /// Report the losses the lifelines found since the last look.
    pub(super) fn take_losses(&mut self) {
        let Some(l) = &self.lost.lifelines else { return };
        self.lost.seen = l.epoch();
        for Loss { id, kind } in l.take() {
            let Some(w) = self
                .lost
                .watched
                .iter_mut()
                .find(|w| w.id == id && w.lost.is_none())
            else {
                continue;
            };
            w.lost = Some(kind);
            let (endpoint, addr) = (w.endpoint, w.addr);
            let failure = CompletionError::PeerLost {
                peer: w.label.clone(),
                how: kind,
            };
            if kind == LossKind::Departed {
                // An orderly end is no event: only what was addressed to
                // the peer fails, and later posts to it.
                log::debug!("peer {} departed", w.label);
            } else {
                log::warn!(peer = w.label.as_str(), fi_addr = addr, op = "liveness", reason:% = kind; "peer {} lost: {kind}", w.label);
                let lost = Err(failure.clone());
                let mut notice = Completion::outcome(Token::PEER_LOST, endpoint, OpKind::PeerLost, lost);
                notice.source = Some(addr);
                self.pending.push(notice);
            }
            self.lost.addrs.push((endpoint, addr));
            // Sends the provider had no room for never reached it.
            self.fail_backlog_to(endpoint, addr, &failure);
            if addr == ffi::FI_ADDR_UNSPEC {
                // What the peer sent before it went may still be on its way
                // through the provider: close after the grace.
                self.lost
                    .closing
                    .push((endpoint, Instant::now() + LOSS_GRACE, failure));
                for s in self
                    .slab
                    .slots
                    .iter_mut()
                    .filter(|s| s.in_use && s.endpoint == endpoint)
                {
                    s.lost = true;
                }
            } else {
                self.doom(endpoint, addr);
            }
        }
    }

    /// Close the lost peers' connections whose grace is over.
    pub(super) fn close_lost_connections(&mut self, now: Instant) {
        while let Some(i) = self.lost.closing.iter().position(|&(_, t, _)| t <= now) {
            let (endpoint, _, failure) = self.lost.closing.swap_remove(i);
            self.fail_connection(endpoint, failure);
        }
    }

    /// A lost peer's connection: close it and fail its operations with
    /// their buffers.
    fn fail_connection(&mut self, endpoint: u32, failure: CompletionError) {
        // What already completed is delivered as it is.
        if let Err(e) = self.read_cq() {
            log::warn!("reading completions before closing a lost peer's connection: {e}");
        }
        let gate = self.progress_gate();
        let gated = gate.as_ref().map(|g| g.lock());
        let Some(Some(state)) = self.endpoints.get_mut(endpoint as usize) else {
            return;
        };
        if state.endpoint.is_none() {
            return;
        }
        // Its entry stays in the table (so that completions read below are
        // delivered), with a null handle: nothing posts to it again, and
        // the entry is removed at the end of this function.
        let closed = state.close();
        drop(gated);
        if let Err(e) = self.read_cq() {
            log::warn!("reading completions of a lost peer's connection: {e}");
        }
        for i in 0..self.slab.slots.len() {
            let s = &mut self.slab.slots[i];
            if !s.in_use || s.endpoint != endpoint || s.abandoned {
                continue;
            }
            if closed.is_err() {
                // Not closed: the provider may still write into it.
                s.abandoned = true;
                self.objects.close_failed = true;
                continue;
            }
            let (internal, group, kind, token) = (s.role.internal(), s.role.group(), s.kind, s.token);
            match internal {
                slab::Internal::No if group != NO_GROUP => {
                    self.finish_part(i as u32, group, Err(failure.clone()))
                }
                slab::Internal::No => {
                    let buffer = self.slab.release(i as u32);
                    let mut c = Completion::outcome(token, endpoint, kind, Err(failure.clone()));
                    c.buffer = buffer;
                    self.pending.push(c);
                }
                slab::Internal::AmRequest => {
                    if let Some(b) = self.slab.release(i as u32) {
                        self.am.bufs.push(b);
                    }
                }
                other => self.am_failed(i as u32, other, failure.clone()),
            }
        }
        if let Err(e) = closed {
            log::warn!(op = "close", endpoint = endpoint, error:% = e; "closing a lost peer's connection: {e}");
        }
        self.endpoints[endpoint as usize] = None;
        self.forget_reclaimed(endpoint);
    }

    /// Operations addressed to a lost peer of an RDM endpoint: cancel the
    /// receives, and give the rest [`LOSS_GRACE`] to come back.
    fn doom(&mut self, endpoint: u32, addr: u64) {
        let until = Instant::now() + LOSS_GRACE;
        let raw = match self.endpoints.get(endpoint as usize) {
            Some(Some(e)) => e.raw,
            _ => return,
        };
        for s in self.slab.slots.iter_mut() {
            if !s.in_use || s.abandoned || s.endpoint != endpoint || s.peer != addr || s.lost {
                continue;
            }
            s.lost = true;
            match s.expires {
                Some(t) if t <= until => {}
                Some(_) => s.expires = Some(until),
                None => {
                    s.expires = Some(until);
                    self.slab.timed += 1;
                }
            }
            if s.kind == OpKind::Recv && !raw.is_null() {
                let ctx = (&mut **s as *mut slab::OpSlot).cast::<std::os::raw::c_void>();
                // SAFETY: the endpoint is open and the receive is posted on
                // it with this context; fi_cancel only looks it up. One that
                // cannot be cancelled ends with the grace.
                unsafe { raw.cancel(ctx) };
            }
        }
        // Wake the deadline scan for the grace.
        self.slab.next_expiry_scan = Instant::now();
    }
}
