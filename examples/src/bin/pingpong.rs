//! `pingpong`: fabric-msg's answer to fabtests' `fi_pingpong`.
//!
//! Server: `pingpong [options]`; client: `pingpong [options] ADDRESS`;
//! both in one process over 127.0.0.1: `pingpong --loopback`. Output has
//! fi_pingpong's columns; `usec/xfer` is one-way (elapsed / iterations / 2)
//! and `MB/sec` counts both directions, as fi_pingpong's do.
//!
//! As fi_pingpong does, each side has its next receive posted before the
//! peer can send, and messages smaller than the provider's inject size go
//! out with `fi_inject` (no send completion to wait for).
//!
//! Also as fi_pingpong does, the server replies from a send buffer of its
//! own and reposts its one receive buffer, and all buffers are written once
//! before the first message (`session::touched`). Only with `--verify`
//! does the server echo the received buffer, so the client can check the
//! bytes. Echoing made the client read, on shm, a megabyte the server's
//! core had just written (a cache-to-cache copy between the two cores), and
//! on this machine that copy took half as long again in some runs and
//! periods as reading data nobody had just written (`docs/benchmarks-history.md`,
//! issue 15, item 2).

use fabric_msg::{Buffer, OpKind};
use fabric_msg_examples::opts::{Opts, Tool};
use fabric_msg_examples::output::Row;
use fabric_msg_examples::pattern::{check, fill};
use fabric_msg_examples::session::{self, provision, touched, AnyResult, Bench, Plan, Side};
use fabric_msg_examples::stats::IterTimes;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    session::main::<PingPong>(Tool::PingPong)
}

/// Send buffers of a client or server (two, so one can be reaped late),
/// and the buffers a server that echoes (`--verify`) receives into and
/// echoes from (three: one posted, one echoing, one whose echo has not
/// completed yet); a server that does not echo has one receive buffer.
const TX_BUFFERS: usize = 2;
const ECHO_BUFFERS: usize = 3;

#[derive(Debug)]
struct PingPong {
    borrowed: bool,
    /// Free buffers: sends (client) or receives (server).
    free: Vec<Buffer>,
    /// The client's receive buffer, when not posted.
    rx: Option<Buffer>,
    /// A server's free send buffers, when it does not echo.
    tx: Vec<Buffer>,
}

/// Wait for sends to complete until `bufs` holds `n` buffers again.
fn reap(side: &mut Side, bufs: &mut Vec<Buffer>, n: usize) -> AnyResult<()> {
    while bufs.len() < n {
        bufs.push(side.wait_send()?);
    }
    Ok(())
}

impl Bench for PingPong {
    const CLIENT_CTRL_DEPTH: usize = 0;

    fn new(o: &Opts) -> Self {
        PingPong {
            borrowed: o.borrowed,
            free: Vec::new(),
            rx: None,
            tx: Vec::new(),
        }
    }

    fn client(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<Row> {
        let size = plan.sizes[k];
        if self.borrowed {
            return client_borrowed(side, plan, size);
        }
        let max = plan.max_size();
        provision(&mut self.free, TX_BUFFERS, max);
        let mut rx = self.rx.take().unwrap_or_else(|| touched(max));
        let inject = side.injects(size);
        let n = plan.messages();
        let mut times = IterTimes::new(plan.iters);
        let mut start = Instant::now();
        for i in 0..n {
            if i == plan.warmup {
                start = Instant::now();
                times.start(start);
            }
            side.recv(rx, i)?;
            if i + 1 == n {
                // What follows the last reply: Ready for the next size, or Done.
                side.post_ctrl_recv()?;
            }
            let mut tx = match self.free.pop() {
                Some(b) => b,
                None => side.wait_send()?,
            };
            tx.set_len(size);
            if plan.verify {
                fill(tx.as_mut_slice(), i);
            }
            if inject {
                side.inject(tx.as_slice(), i)?;
                self.free.push(tx);
            } else {
                side.send(tx, i)?;
            }
            if i > plan.warmup {
                // The previous round trip ends here, send to send: the
                // clock is read while this message is on its way, not
                // between a reply and the next send.
                times.lap(2); // one way: half the round trip
            }
            let mut reply = None;
            while reply.is_none() {
                side.poll(|_, c| {
                    match c.kind {
                        OpKind::Recv => reply = c.buffer.take(),
                        OpKind::Send => self.free.extend(c.buffer.take()),
                        other => return Err(format!("unexpected {other:?} completion").into()),
                    }
                    Ok(())
                })?;
            }
            rx = reply.ok_or("a receive completes with its buffer")?;
            if plan.verify {
                check(rx.as_slice(), i, size)?;
            }
            side.tick(i + 1);
        }
        if n > plan.warmup {
            times.lap(2); // the last round trip
        }
        let elapsed = times.elapsed_since(start);
        self.rx = Some(rx);
        reap(side, &mut self.free, TX_BUFFERS)?;
        Ok(Row {
            bytes: size,
            sent: plan.iters,
            acked: plan.iters,
            elapsed,
            xfers_per_iter: 2,
            tail: times.tail(),
        })
    }

    fn server(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<()> {
        let size = plan.sizes[k];
        // Echo only to let the client check the bytes (--verify).
        let echo = plan.verify;
        let max = plan.max_size();
        provision(&mut self.free, if echo { ECHO_BUFFERS } else { 1 }, max);
        if !echo {
            provision(&mut self.tx, TX_BUFFERS, max);
        }
        let inject = side.injects(size);
        let n = plan.messages();
        let first = self.free.pop().expect("provisioned");
        side.recv(first, 0)?;
        side.ready(k)?;
        for i in 0..n {
            let mut got = None;
            while got.is_none() {
                side.poll(|_, c| {
                    match c.kind {
                        OpKind::Recv => got = c.buffer.take(),
                        OpKind::Send if echo => self.free.extend(c.buffer.take()),
                        OpKind::Send => self.tx.extend(c.buffer.take()),
                        other => return Err(format!("unexpected {other:?} completion").into()),
                    }
                    Ok(())
                })?;
            }
            let b = got.ok_or("a receive completes with its buffer")?;
            if plan.verify {
                check(b.as_slice(), i, size)?;
            }
            // The reply goes out from the received buffer (echo) or from a
            // send buffer, and the received one is free again at once.
            let mut reply = if echo {
                b
            } else {
                self.free.push(b);
                match self.tx.pop() {
                    Some(t) => t,
                    None => side.wait_send()?,
                }
            };
            // The next receive goes up before the reply goes out.
            if i + 1 < n {
                let next = match self.free.pop() {
                    Some(r) => r,
                    None => side.wait_send()?,
                };
                side.recv(next, i + 1)?;
            } else if k + 1 == plan.sizes.len() {
                side.post_ctrl_recv()?; // for the client's Done
            }
            reply.set_len(size);
            let home = if echo { &mut self.free } else { &mut self.tx };
            if inject {
                side.inject(reply.as_slice(), i)?;
                home.push(reply);
            } else {
                side.send(reply, i)?;
            }
            side.tick(i + 1);
        }
        if echo {
            reap(side, &mut self.free, ECHO_BUFFERS)
        } else {
            reap(side, &mut self.tx, TX_BUFFERS)
        }
    }
}

/// The client loop on its own memory: `send_borrowed` / `recv_borrowed`.
fn client_borrowed(side: &mut Side, plan: &Plan, size: usize) -> AnyResult<Row> {
    let max = plan.max_size();
    let (mut tx, mut rx) = (vec![0u8; max], vec![0u8; max]);
    let r = borrowed_loop(side, plan, size, &mut tx, &mut rx);
    if r.is_err() {
        // Operations may still be in flight on `tx` and `rx`: closing the
        // endpoint drops them before the memory goes. If it cannot be
        // closed, the memory is leaked rather than freed under the NIC.
        if side.ev.close_endpoint(side.peer.endpoint()).is_err() {
            std::mem::forget((tx, rx));
        }
    }
    r
}

fn borrowed_loop(side: &mut Side, plan: &Plan, size: usize, tx: &mut [u8], rx: &mut [u8]) -> AnyResult<Row> {
    let n = plan.messages();
    let mut times = IterTimes::new(plan.iters);
    let mut start = Instant::now();
    for i in 0..n {
        if i == plan.warmup {
            start = Instant::now();
            times.start(start);
        }
        if plan.verify {
            fill(&mut tx[..size], i);
        }
        // SAFETY: `tx` and `rx` are not touched again until both
        // completions have come back from poll below; on failure the
        // caller closes the endpoint before freeing them.
        unsafe {
            side.recv_borrowed(rx.as_mut_ptr(), rx.len(), i)?;
            if i + 1 == n {
                side.post_ctrl_recv()?; // Ready for the next size, or Done
            }
            side.send_borrowed(tx.as_ptr(), size, i)?;
        }
        if i > plan.warmup {
            times.lap(2); // the previous round trip, send to send
        }
        let (mut sent, mut got) = (false, None);
        while !sent || got.is_none() {
            side.poll(|_, c| {
                match c.kind {
                    OpKind::Send => sent = true,
                    OpKind::Recv => got = Some(c.multi.map_or(0, |(_, len)| len)),
                    other => return Err(format!("unexpected {other:?} completion").into()),
                }
                Ok(())
            })?;
        }
        if plan.verify {
            check(&rx[..got.unwrap_or(0)], i, size)?;
        }
        side.tick(i + 1);
    }
    if n > plan.warmup {
        times.lap(2);
    }
    Ok(Row {
        bytes: size,
        sent: plan.iters,
        acked: plan.iters,
        elapsed: times.elapsed_since(start),
        xfers_per_iter: 2,
        tail: times.tail(),
    })
}
