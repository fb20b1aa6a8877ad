//! `bandwidth`: streaming bandwidth, as fabtests' `fi_msg_bw` and
//! `fi_rdm_tagged_bw` measure it.
//!
//! The client keeps a window (`-w`, default 64) of sends in flight; the
//! server keeps as many receives posted, reposting each buffer for the
//! next window as its message arrives, and once a window has arrived it
//! answers with a small ack, which lets the client send the next window. `MB/sec` is payload in one
//! direction, 10^6 bytes per second; `usec/xfer` is elapsed / messages,
//! and its percentiles are of each window's time from the previous ack to
//! its own, over the window's messages.
//! Messages smaller than the provider's inject size go out with
//! `fi_inject`, as fabtests sends them. Warm-up (`-W`) is rounded up to
//! whole windows, so every buffer has been used once before the clock
//! starts.

use fabric_msg::{Buffer, OpKind};
use fabric_msg_examples::opts::{Opts, Tool};
use fabric_msg_examples::output::Row;
use fabric_msg_examples::pattern::{check, fill};
use fabric_msg_examples::session::{self, provision, AnyResult, Bench, Ctrl, Plan, Side};
use fabric_msg_examples::stats::IterTimes;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    session::main::<Bandwidth>(Tool::Bandwidth)
}

#[derive(Debug)]
struct Bandwidth {
    /// Free message buffers: a window of them.
    free: Vec<Buffer>,
}

/// Warm-up messages: `-W` rounded up to whole windows.
fn warmup(plan: &Plan) -> usize {
    plan.warmup.div_ceil(plan.window) * plan.window
}

impl Bench for Bandwidth {
    /// The client receives only control messages (acks, Ready, Done), so
    /// two stay posted: the last ack of a size and what follows it.
    const CLIENT_CTRL_DEPTH: usize = 2;

    fn new(_: &Opts) -> Self {
        Bandwidth { free: Vec::new() }
    }

    fn messages(plan: &Plan) -> usize {
        warmup(plan) + plan.iters
    }

    fn client(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<Row> {
        let (size, w) = (plan.sizes[k], plan.window);
        provision(&mut self.free, w, size);
        let inject = side.injects(size);
        let warm = warmup(plan);
        let total = Self::messages(plan);
        let (mut seq, mut acked) = (0, 0);
        let mut times = IterTimes::new(plan.iters.div_ceil(w));
        let mut start = Instant::now();
        while seq < total {
            if seq == warm {
                start = Instant::now();
                times.start(start);
            }
            let count = w.min(total - seq);
            for s in seq..seq + count {
                let mut b = match self.free.pop() {
                    Some(b) => b,
                    None => side.wait_send()?,
                };
                b.set_len(size);
                if plan.verify {
                    fill(b.as_mut_slice(), s);
                }
                if inject {
                    side.inject(b.as_slice(), s)?;
                    self.free.push(b);
                } else {
                    side.send(b, s)?;
                }
            }
            let free = &mut self.free;
            let got = match side.wait_ctrl_with(|_, c| match c.kind {
                OpKind::Send => {
                    free.extend(c.buffer.take());
                    Ok(())
                }
                OpKind::Recv => Err("data arrived at the client".into()),
                other => Err(format!("unexpected {other:?} completion").into()),
            })? {
                Ctrl::Ack { count } => count,
                other => return Err(format!("expected an ack, got {other:?}").into()),
            };
            if got != count {
                return Err(format!("the server acknowledged {got} of a window of {count}").into());
            }
            if seq >= warm {
                acked += got;
                // The window's completion time, per message.
                times.lap(count);
            }
            seq += count;
            side.tick(seq);
        }
        let elapsed = times.elapsed_since(start);
        while self.free.len() < w {
            let b = side.wait_send()?;
            self.free.push(b);
        }
        Ok(Row {
            bytes: size,
            sent: plan.iters,
            acked,
            elapsed,
            xfers_per_iter: 1,
            tail: times.tail(),
        })
    }

    fn server(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<()> {
        let (size, w) = (plan.sizes[k], plan.window);
        provision(&mut self.free, w, size);
        let total = Self::messages(plan);
        let mut seq = 0;
        // Receives are posted for messages `..posted`: the first window's
        // now, and each later message's as soon as the buffer it will use
        // is free again (message `s + w` takes the buffer of `s`). So a
        // window's receives are up before the ack that lets the client
        // send it, as before, but they are posted while the client is
        // still sending the current window, not between its last message
        // and the ack, where the client waits for them.
        let mut posted = w.min(total);
        self.post_window(side, seq, posted)?;
        side.ready(k)?;
        while seq < total {
            let count = w.min(total - seq);
            let mut arrived = 0;
            while arrived < count {
                let free = &mut self.free;
                side.poll(|side, c| {
                    let b = c.buffer.take().ok_or("a receive completes with its buffer")?;
                    if c.kind != OpKind::Recv {
                        return Err("the server sends no data".into());
                    }
                    if plan.verify {
                        check(b.as_slice(), c.token.0 as usize, size)?;
                    }
                    if posted < total {
                        side.recv(b, posted)?;
                        posted += 1;
                    } else {
                        free.push(b);
                    }
                    arrived += 1;
                    Ok(())
                })?;
                side.tick(seq + arrived);
            }
            seq += count;
            if seq == total && k + 1 == plan.sizes.len() {
                side.post_ctrl_recv()?; // for the client's Done
            }
            side.send_ctrl(&Ctrl::Ack { count }, false)?;
        }
        Ok(())
    }
}

impl Bandwidth {
    /// Post receives for messages `first..first + count`.
    fn post_window(&mut self, side: &mut Side, first: usize, count: usize) -> AnyResult<()> {
        for s in first..first + count {
            let b = self.free.pop().ok_or("fewer buffers than the window")?;
            side.recv(b, s)?;
        }
        Ok(())
    }
}
