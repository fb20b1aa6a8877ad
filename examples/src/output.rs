//! What the tools print: fabtests' header and columns, or JSON Lines; and,
//! on a terminal, a progress line on stderr.

use crate::opts::{Opts, Tool};
use crate::stats::{self, Tail};
use fabric_msg::{LossAlarm, LostPeer, Profile, WaitMode};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One measured size, as a client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Message size.
    pub bytes: usize,
    /// Messages sent, after warm-up.
    pub sent: usize,
    /// Messages the peer acknowledged: replies (pingpong) or the counts in
    /// its acks (bandwidth).
    pub acked: usize,
    /// Time from the first measured message to the last reply or ack.
    pub elapsed: Duration,
    /// Transfers per message counted: 2 for a ping-pong (there and back),
    /// 1 for streaming. As fabtests' `xfers_per_iter`.
    pub xfers_per_iter: usize,
    /// Percentiles of the per-iteration times, in the unit of `usec/xfer`
    /// (an iteration's time over its transfers); `None` with timing off.
    pub tail: Option<Tail>,
}

impl Row {
    /// Payload bytes moved, every direction counted.
    pub fn total_bytes(&self) -> u64 {
        (self.sent * self.xfers_per_iter) as u64 * self.bytes as u64
    }

    /// Microseconds per transfer (one way).
    pub fn usec_per_xfer(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e6 / (self.sent * self.xfers_per_iter) as f64
    }

    /// 10^6 bytes per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.total_bytes() as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// The header: the fabric, then (in text) the column names.
pub fn header(o: &Opts, p: &Profile) {
    let wait = match o.wait {
        WaitMode::Spin => "spin",
        WaitMode::Block if p.wait_fd => "fd",
        WaitMode::Block => "fd (no wait object: spins)",
        WaitMode::Adaptive if p.wait_fd => "spin, yield, fd",
        _ => "spin, yield",
    };
    let tagged = if o.tagged { "tagged" } else { "untagged" };
    let mut extra = serde_json::json!({"messages": tagged, "wait": wait});
    let mut text = format!("{tagged}, wait {wait}");
    if o.tool == Tool::Bandwidth {
        extra["window"] = o.window.into();
        text += &format!(", window {}", o.window);
    }
    progress(o, &mut extra, &mut text);
    header_with(o.json, o.tool.name(), p, extra, &text);
}

/// The progress thread (`--progress-us`), where there is one, in a header.
pub fn progress(o: &Opts, extra: &mut serde_json::Value, text: &mut String) {
    if o.progress_us > 0 {
        extra["progress_us"] = o.progress_us.into();
        *text += &format!(", progress thread every {} µs", o.progress_us);
    }
}

/// The header of any tool: the fabric, what else `extra` (JSON) and
/// `text` say about the run, then (in text) the column names.
pub fn header_with(json: bool, tool: &str, p: &Profile, extra: serde_json::Value, text: &str) {
    let _term = TERMINAL.lock();
    clear_progress();
    if json {
        let mut v = serde_json::json!({"provider": p.provider, "fabric_kind": p.fabric_kind,
            "domain": p.domain, "endpoint_type": p.endpoint_type, "tool": tool});
        if let (Some(v), serde_json::Value::Object(more)) = (v.as_object_mut(), extra) {
            v.extend(more);
        }
        crate::say!("{v}");
    } else {
        crate::say!(
            "# {} ({}) domain {} endpoint {}, {text}",
            p.provider,
            p.fabric_kind,
            p.domain,
            p.endpoint_type
        );
        crate::say!(
            "{:<8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>12}{}",
            "bytes",
            "#sent",
            "#ack",
            "total",
            "time",
            "MB/sec",
            "usec/xfer",
            "Mxfers/sec",
            stats::columns(TAIL_WIDTH)
        );
    }
    std::io::stdout().flush().ok();
}

/// One line of results.
pub fn report(o: &Opts, r: &Row) {
    report_row(o.json, r)
}

/// One line of results, in text or JSON.
pub fn report_row(json: bool, r: &Row) {
    let secs = r.elapsed.as_secs_f64();
    let usec = r.usec_per_xfer();
    let _term = TERMINAL.lock();
    clear_progress();
    if json {
        let mut v = serde_json::json!({"bytes": r.bytes, "iters": r.sent, "sent": r.sent, "acked": r.acked,
            "usec_per_xfer": usec, "mb_per_sec": r.mb_per_sec(), "total_bytes": r.total_bytes(),
            "seconds": secs});
        if let Some(t) = &r.tail {
            t.add_json(&mut v);
        }
        crate::say!("{v}");
    } else {
        crate::say!(
            "{:<8} {:>8} {:>8} {:>8} {:>9.2}s {:>10.2} {:>10.2} {:>12.2}{}",
            r.bytes,
            r.sent,
            r.acked,
            size_str(r.total_bytes()),
            secs,
            r.mb_per_sec(),
            usec,
            1.0 / usec,
            stats::cells(r.tail.as_ref(), TAIL_WIDTH)
        );
    }
    std::io::stdout().flush().ok();
}

/// Width of each percentile column in the table.
const TAIL_WIDTH: usize = 9;

/// `12k`, `3m`: bytes in binary units, rounded down.
fn size_str(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{}g", b >> 30),
        b if b >= 1 << 20 => format!("{}m", b >> 20),
        b => format!("{}k", b >> 10),
    }
}

/// Serialises the progress line and result lines on a terminal.
static TERMINAL: Mutex<()> = Mutex::new(());
/// Whether a progress line is on the screen.
static SHOWN: AtomicBool = AtomicBool::new(false);

fn clear_progress() {
    if SHOWN.swap(false, Ordering::Relaxed) {
        eprint!("\r\x1b[K");
    }
}

/// Progress of the side that reports, watched by a thread that draws a
/// progress line on a terminal and ends the process when nothing moves
/// for too long, so a dead peer cannot hang the tool.
#[derive(Debug)]
pub struct Monitor {
    tool: &'static str,
    /// Messages done in the current size.
    done: AtomicU64,
    /// Messages the current size has in all (0: not started).
    total: AtomicU64,
    /// The current size.
    size: AtomicU64,
    /// Watching: set once the peer is connected.
    armed: AtomicBool,
    stop: AtomicBool,
    /// The event loop's lost peers, once [`Monitor::watch_losses`] gave it.
    losses: Mutex<Option<LossAlarm>>,
}

/// How long the data path may stand still before the tool gives up.
pub const STALL: Duration = Duration::from_secs(30);

/// How long after a peer's loss the data path may stand still before the
/// tool takes itself to be stuck inside libfabric (libfabric 1.17's shm
/// spins for ever on a lock a killed process held). The loop itself
/// reports a loss within [`LOSS_GRACE`](fabric_msg::transport::liveness::LOSS_GRACE)
/// (300 ms) of it, and the tool then ends.
pub const STUCK_AFTER_LOSS: Duration = Duration::from_millis(600);

impl Monitor {
    /// Start the watching thread. The progress line is drawn only when
    /// stderr is a terminal and `show` is set.
    pub fn start(tool: Tool, show: bool) -> Arc<Monitor> {
        Monitor::start_named(tool.name(), show)
    }

    /// [`Monitor::start`] for a tool outside [`Tool`], by its name.
    pub fn start_named(tool: &'static str, show: bool) -> Arc<Monitor> {
        let m = Arc::new(Monitor {
            tool,
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            size: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            losses: Mutex::new(None),
        });
        let show = show && std::io::stderr().is_terminal();
        let w = m.clone();
        std::thread::Builder::new()
            .name("monitor".into())
            .spawn(move || w.watch(show))
            .expect("spawning the monitor thread");
        m
    }

    fn watch(&self, show: bool) {
        let started = Instant::now();
        let (mut last, mut moved) = ((u64::MAX, u64::MAX), Instant::now());
        let mut ticks = 0u32;
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            ticks += 1;
            if !self.armed.load(Ordering::Relaxed) {
                moved = Instant::now();
                continue;
            }
            let now = (
                self.size.load(Ordering::Relaxed),
                self.done.load(Ordering::Relaxed),
            );
            if now != last {
                (last, moved) = (now, Instant::now());
            } else if let Some(lost) = self.stuck_after_loss(moved) {
                let _term = TERMINAL.lock();
                clear_progress();
                eprintln!(
                    "{}: {lost}; no progress here in the {} ms since (stuck inside libfabric on a lock the \
                     lost process held?): giving up",
                    self.tool,
                    lost.at.elapsed().as_millis()
                );
                std::process::exit(1);
            } else if moved.elapsed() > STALL {
                let _term = TERMINAL.lock();
                clear_progress();
                eprintln!(
                    "{}: no progress for {} s ({} bytes, {} messages done): is the peer alive?",
                    self.tool,
                    STALL.as_secs(),
                    now.0,
                    now.1
                );
                std::process::exit(1);
            }
            let total = self.total.load(Ordering::Relaxed);
            if show && ticks % 2 == 0 && total > 0 && started.elapsed() > Duration::from_secs(1) {
                let _term = TERMINAL.lock();
                eprint!(
                    "\r\x1b[K{}: {} bytes, {}/{} messages ({}%)",
                    self.tool,
                    now.0,
                    now.1,
                    total,
                    now.1 * 100 / total
                );
                SHOWN.store(true, Ordering::Relaxed);
            }
        }
        let _term = TERMINAL.lock();
        clear_progress();
    }

    /// The first lost peer, if one was lost [`STUCK_AFTER_LOSS`] ago and
    /// the data path has not moved for half that (`moved`: when it last
    /// did; a message already on its way may still have arrived after the
    /// loss).
    fn stuck_after_loss(&self, moved: Instant) -> Option<LostPeer> {
        let lost = self.losses.lock().ok()?.as_ref()?.first()?;
        (lost.at.elapsed() > STUCK_AFTER_LOSS && moved.elapsed() > STUCK_AFTER_LOSS / 2).then_some(lost)
    }

    /// Watch `alarm` too: a peer lost while the data path stands still
    /// ends the tool after [`STUCK_AFTER_LOSS`] rather than [`STALL`].
    pub fn watch_losses(&self, alarm: LossAlarm) {
        if let Ok(mut l) = self.losses.lock() {
            *l = Some(alarm);
        }
    }

    /// The peer is connected: from now on, standing still is an error.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// A new size of `total` messages begins.
    pub fn begin(&self, size: usize, total: usize) {
        self.done.store(0, Ordering::Relaxed);
        self.size.store(size as u64, Ordering::Relaxed);
        self.total.store(total as u64, Ordering::Relaxed);
    }

    /// `done` messages of the current size are finished.
    #[inline]
    pub fn tick(&self, done: usize) {
        self.done.store(done as u64, Ordering::Relaxed);
    }

    /// Stop watching and take the progress line away.
    pub fn finish(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _term = TERMINAL.lock();
        clear_progress();
    }
}

/// A short name for an atomic operation, as `fabric_info` and `atomics`
/// print it (`fetch_add`, `compare_swap`, ...).
pub fn atomic_op_name(op: fabric_msg::AtomicKind) -> &'static str {
    use fabric_msg::AtomicKind::*;
    match op {
        Add => "add",
        FetchAdd => "fetch_add",
        Swap => "swap",
        CompareSwap => "compare_swap",
        FetchMin => "fetch_min",
        FetchMax => "fetch_max",
        Read => "read",
    }
}

/// `--stats`: the loop's counters ([`fabric_msg::EventLoop::stats`]), one
/// JSON object (`"stats": side`) or a few lines of text.
pub fn loop_stats(json: bool, side: &str, s: &fabric_msg::LoopStats) {
    let peers: Vec<serde_json::Value> = s
        .peers
        .iter()
        .map(|p| {
            serde_json::json!({"endpoint": p.endpoint.index(), "addr": p.addr,
                "sent_msgs": p.sent.messages, "sent_bytes": p.sent.bytes,
                "received_msgs": p.received.messages, "received_bytes": p.received.bytes})
        })
        .collect();
    let v = serde_json::json!({
        "stats": side,
        "sent_msgs": s.sent.messages, "sent_bytes": s.sent.bytes,
        "received_msgs": s.received.messages, "received_bytes": s.received.bytes,
        "received_from_unknown_msgs": s.received_from_unknown.messages,
        "backlogged": s.backlogged, "longest_backlog_wait_us": s.longest_backlog_wait.as_micros() as u64,
        "retries": s.retries, "truncations": s.truncations, "lost_peers": s.lost_peers,
        "atomics_applied": s.atomics.applied_requests, "atomics_denied": s.atomics.denied_requests,
        "atomics_refused": s.atomics.refused_requests, "forged_replies": s.atomics.forged_replies,
        "peers": peers,
    });
    if json {
        println!("{v}");
        return;
    }
    println!(
        "# {side} stats: sent {} messages ({} B), received {} ({} B, {} from unknown senders); {} backlogged, \
         longest backlog wait {:?}, {} retries on a full queue, {} truncations, {} lost peers; emulated atomics: \
         {} applied, {} denied, {} refused, {} forged replies",
        s.sent.messages,
        s.sent.bytes,
        s.received.messages,
        s.received.bytes,
        s.received_from_unknown.messages,
        s.backlogged,
        s.longest_backlog_wait,
        s.retries,
        s.truncations,
        s.lost_peers,
        s.atomics.applied_requests,
        s.atomics.denied_requests,
        s.atomics.refused_requests,
        s.atomics.forged_replies
    );
    for p in &s.peers {
        println!(
            "#   peer {} on endpoint {}: sent {} ({} B), received {} ({} B)",
            p.addr,
            p.endpoint.index(),
            p.sent.messages,
            p.sent.bytes,
            p.received.messages,
            p.received.bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_fabtests() {
        let r = Row {
            bytes: 1000,
            sent: 500,
            acked: 500,
            elapsed: Duration::from_millis(10),
            xfers_per_iter: 2,
            tail: None,
        };
        assert_eq!(r.total_bytes(), 1_000_000);
        assert!((r.usec_per_xfer() - 10.0).abs() < 1e-9, "elapsed / iters / 2");
        assert!((r.mb_per_sec() - 100.0).abs() < 1e-9, "both directions, 10^6 B/s");
        let r = Row {
            xfers_per_iter: 1,
            ..r
        };
        assert!((r.mb_per_sec() - 50.0).abs() < 1e-9, "one direction");
        assert_eq!(size_str(1536 << 10), "1m");
        assert_eq!(size_str(3 << 30), "3g");
    }
}
