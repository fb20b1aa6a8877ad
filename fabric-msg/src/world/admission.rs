//! How the rendezvous root lets ranks in: every connection is read at the
//! same time, each with its own budget, so connections that say nothing
//! (a port scanner, a stale client, a hostile peer) cannot keep honest
//! ranks waiting.
//!
//! The root accepts without blocking and keeps the connections that have
//! not yet said their first frame in a list of at most [`MAX_PENDING`],
//! reading whatever each has sent whenever it has sent it. A connection
//! whose first frame is not complete within [`BUDGET`] (or is longer than
//! [`MAX_FIRST_FRAME`]: a `Join` is a few bytes) is closed; once the list
//! is full the oldest is closed to make room. Honest ranks send their
//! `Join` the moment they connect, so they are served within milliseconds
//! whatever else is connected. The root remembers what it turned away, so
//! a world that does not form says what actually happened.
//!
//! The framing is the rendezvous' (`transport/framing.rs`: a little-endian
//! `u32` length, then the body); what a body means is the caller's [`Judge`].

use crate::transport::framing::{FrameReader, ReadFail};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Longest a connection may take to send its first frame.
pub(crate) const BUDGET: Duration = Duration::from_secs(5);
/// Most connections waited on at once.
pub(crate) const MAX_PENDING: usize = 128;
/// Longest first frame read: a `Join` is under 20 bytes.
pub(crate) const MAX_FIRST_FRAME: usize = 256;

/// What the caller makes of a first frame.
pub(crate) enum Verdict {
    /// A joining rank.
    Join(u32),
    /// Not one: the reason is sent back, then the connection closed.
    Refuse(String),
}

/// The caller's reading of a first frame's body.
pub(crate) trait Judge {
    /// What `body` says.
    fn judge(&mut self, body: &[u8]) -> Verdict;
    /// Send `reason` back on `s` before it is closed.
    fn refuse(&mut self, s: &mut TcpStream, reason: String);
}

/// A connection that has not yet sent its first frame.
struct Pending {
    s: TcpStream,
    from: SocketAddr,
    frame: FrameReader,
    since: Instant,
}

/// What happened to the connections that did not become ranks.
#[derive(Debug, Default)]
pub(crate) struct Turned {
    /// Sent nothing complete within the budget, or was pushed out of a full list.
    pub(crate) silent: usize,
    /// Connected and closed without a frame.
    pub(crate) closed: usize,
    /// Refused, with the first few reasons.
    pub(crate) refused: usize,
    pub(crate) reasons: Vec<String>,
}

impl Turned {
    /// `""`, or a sentence on what else connected, for an error message.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.silent > 0 {
            parts.push(format!(
                "{} sent no Join within {BUDGET:?} (not fabric-msg ranks?)",
                self.silent
            ));
        }
        if self.closed > 0 {
            parts.push(format!("{} closed without a word", self.closed));
        }
        if self.refused > 0 {
            parts.push(format!(
                "{} were refused ({})",
                self.refused,
                self.reasons.join("; ")
            ));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("; other connections to the root: {}", parts.join(", "))
        }
    }

    fn refused(&mut self, reason: String) {
        self.refused += 1;
        if self.reasons.len() < 3 {
            self.reasons.push(reason);
        }
    }
}

/// What the root ends its admission with.
pub(crate) struct Admitted {
    /// By rank (index 0 unused): every joining rank's, unless `deadline`
    /// came first.
    pub(crate) conns: Vec<Option<TcpStream>>,
    /// Every rank joined.
    pub(crate) complete: bool,
    /// What the other connections did.
    pub(crate) turned: Turned,
}

/// Let ranks in until all `size` (rank 0 being the caller) have joined or
/// `deadline` passes.
pub(crate) fn admit(
    listener: &TcpListener,
    size: u32,
    deadline: Instant,
    judge: &mut dyn Judge,
) -> std::io::Result<Admitted> {
    listener.set_nonblocking(true)?;
    let mut conns: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    let mut joined = 1;
    let mut pending: Vec<Pending> = Vec::new();
    let mut turned = Turned::default();
    while joined < size {
        let mut busy = false;
        loop {
            match listener.accept() {
                Ok((s, from)) => {
                    busy = true;
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() >= MAX_PENDING {
                        let oldest = pending.remove(0);
                        log::warn!("rendezvous: closed {} to make room: it sent no Join", oldest.from);
                        turned.silent += 1;
                    }
                    pending.push(Pending {
                        s,
                        from,
                        frame: FrameReader::new(MAX_FIRST_FRAME),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Out of descriptors (EMFILE, ENFILE) or a connection reset
                // before it was accepted: make room and go on.
                Err(e) => {
                    log::warn!("rendezvous: accept: {e}");
                    if !pending.is_empty() {
                        pending.remove(0);
                        turned.silent += 1;
                    }
                    break;
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            match step(&mut pending[i]) {
                Step::More if now.duration_since(pending[i].since) < BUDGET => i += 1,
                Step::More => {
                    let p = pending.remove(i);
                    log::warn!("rendezvous: closed {}: no Join within {BUDGET:?}", p.from);
                    turned.silent += 1;
                }
                Step::Closed => {
                    let p = pending.remove(i);
                    log::warn!("rendezvous: {} connected and closed", p.from);
                    turned.closed += 1;
                    busy = true;
                }
                Step::Bad(reason) => {
                    let mut p = pending.remove(i);
                    refuse(judge, &mut p, reason.clone());
                    turned.refused(reason);
                    busy = true;
                }
                Step::Frame(body) => {
                    busy = true;
                    let mut p = pending.remove(i);
                    let verdict = match judge.judge(&body) {
                        Verdict::Join(r) if conns.get(r as usize).is_some_and(|c| c.is_some()) => {
                            Verdict::Refuse(format!("rank {r} has already joined"))
                        }
                        v => v,
                    };
                    match verdict {
                        Verdict::Join(rank) => {
                            if p.s.set_nonblocking(false).is_ok() {
                                conns[rank as usize] = Some(p.s);
                                joined += 1;
                            }
                        }
                        Verdict::Refuse(reason) => {
                            refuse(judge, &mut p, reason.clone());
                            turned.refused(reason);
                        }
                    }
                }
            }
        }
        if joined >= size {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(Admitted {
        complete: joined >= size,
        conns,
        turned,
    })
}

/// Ranks for a message, short whatever their number: "rank 3",
/// "ranks 1-4, 7 (5 ranks)", at most eight runs then "...".
pub(crate) fn ranks_text(ranks: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == r => *hi = r,
            _ => runs.push((r, r)),
        }
    }
    let mut text: Vec<String> = runs
        .iter()
        .take(8)
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    if runs.len() > 8 {
        text.push("...".into());
    }
    match ranks.len() {
        1 => format!("rank {}", ranks[0]),
        n => format!("ranks {} ({n} ranks)", text.join(", ")),
    }
}

fn refuse(judge: &mut dyn Judge, p: &mut Pending, reason: String) {
    log::warn!("rendezvous: refused {}: {reason}", p.from);
    let _ = p.s.set_nonblocking(false);
    let _ = p.s.set_write_timeout(Some(Duration::from_millis(200)));
    judge.refuse(&mut p.s, reason);
}

enum Step {
    /// Not complete yet.
    More,
    /// Closed before a whole frame.
    Closed,
    /// Not a frame the root reads.
    Bad(String),
    /// The first frame's body.
    Frame(Vec<u8>),
}

/// Read what `p` has sent so far, without waiting.
fn step(p: &mut Pending) -> Step {
    match p.frame.read(&mut p.s) {
        Ok(Some(body)) => Step::Frame(body),
        Ok(None) => Step::More,
        Err(ReadFail::TooLong(len)) => Step::Bad(format!(
            "a first frame of {len} bytes; a Join has at most {MAX_FIRST_FRAME}"
        )),
        Err(ReadFail::Closed(_) | ReadFail::Io(_) | ReadFail::TimedOut) => Step::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::{admit, ranks_text, Judge, Verdict, BUDGET};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    #[test]
    fn rank_lists_stay_short() {
        assert_eq!(ranks_text(&[3]), "rank 3");
        assert_eq!(ranks_text(&[1, 2, 3, 4, 7]), "ranks 1-4, 7 (5 ranks)");
        let many: Vec<u32> = (1..1 << 24).collect();
        assert_eq!(ranks_text(&many), "ranks 1-16777215 (16777215 ranks)");
        let odd: Vec<u32> = (1..1000).filter(|r| r % 2 == 1).collect();
        let text = ranks_text(&odd);
        assert!(text.ends_with(", ... (500 ranks)") && text.len() < 80, "{text}");
    }

    /// A one-byte body is the rank; anything else is refused.
    struct ByteJudge;

    impl Judge for ByteJudge {
        fn judge(&mut self, body: &[u8]) -> Verdict {
            match body {
                [r] => Verdict::Join(u32::from(*r)),
                _ => Verdict::Refuse(format!("{} bytes", body.len())),
            }
        }
        fn refuse(&mut self, _: &mut TcpStream, _: String) {}
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    /// Idle connections opened first, one sending half a frame, one too
    /// long a frame, one a duplicate: the two honest ranks are in within
    /// a fraction of the per-connection budget.
    #[test]
    fn idle_and_bad_connections_do_not_delay_honest_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
        let addr = listener.local_addr().expect("address");
        let client = std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).expect("idle")).collect();
            let mut half = TcpStream::connect(addr).expect("half");
            half.write_all(&[5, 0]).expect("write");
            let mut long = TcpStream::connect(addr).expect("long");
            long.write_all(&u32::MAX.to_le_bytes()).expect("write");
            for r in [1u8, 1, 2] {
                let mut s = TcpStream::connect(addr).expect("rank");
                s.write_all(&frame(&[r])).expect("write");
                held.push(s);
            }
            held.extend([half, long]);
            std::thread::sleep(Duration::from_secs(2));
        });
        let started = Instant::now();
        let deadline = started + Duration::from_secs(30);
        let got = admit(&listener, 3, deadline, &mut ByteJudge).expect("admit");
        assert!(got.complete);
        assert!(got.conns[1].is_some() && got.conns[2].is_some());
        assert!(started.elapsed() < BUDGET, "took {:?}", started.elapsed());
        assert_eq!(got.turned.refused, 2, "{:?}", got.turned);
        client.join().expect("client");
    }
}
