//! The plain rendezvous: no launcher, just `FABRIC_MSG_RANK`,
//! `FABRIC_MSG_SIZE` and `FABRIC_MSG_ROOT=host:port`.
//!
//! Rank 0 listens on the root address; every other rank connects (retrying
//! until the start-up deadline, since the root may start last) and says
//! `Join { rank, size }`. A connection that says anything else, a rank out of
//! range or one already taken is refused with a reason and the root goes on
//! waiting: one bad connection never stops a world from forming. An
//! all-gather is then every rank sending its bytes to the root and the root
//! sending the whole table back.
//!
//! The connections stay open for the life of the world as its liveness
//! channel: a rank whose process ends closes its socket, the root sees it at
//! once and tells every other rank (`Lost`); if the root goes, every rank
//! sees its socket close. A rank that finishes says `Bye`; the root answers
//! `Done` to all once every rank has, so a normal exit is never taken for a
//! death. A stopped (not dead) process keeps its socket open and is not
//! detected here.
//!
//! Frames: a little-endian `u32` length, then postcard, at most
//! [`MAX_FRAME`] bytes, refused before any allocation; every read has a
//! deadline.

use super::admission::{admit, ranks_text, Judge, Verdict};
use super::leaving::keep_until_exit;
use super::liveness::Liveness;
use crate::error::{Error, Result};
use crate::transport::framing::write_frame;
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `FMSW`: the first field of every `Join`.
const MAGIC: u32 = 0x464d_5357;
/// Version of this exchange.
const VERSION: u16 = 1;
/// Largest frame accepted: a table of every rank's endpoint name and profile.
pub(crate) const MAX_FRAME: usize = 4 << 20;
/// Most ranks the star at rank 0 serves: one TCP connection (one file
/// descriptor) per rank, and a table of every rank's address within
/// [`MAX_FRAME`]. Checked before anything is sized by the rank count.
pub(crate) const MAX_RANKS: u32 = 1 << 14;

#[derive(Debug, Serialize, Deserialize)]
enum Frame {
    Join {
        magic: u32,
        version: u16,
        rank: u32,
        size: u32,
    },
    Welcome,
    Reject {
        reason: String,
    },
    Data {
        bytes: Vec<u8>,
    },
    Table {
        entries: Vec<Vec<u8>>,
    },
    Abort {
        reason: String,
    },
    Lost {
        rank: u32,
        why: String,
    },
    Bye,
    Done,
}

/// This rank's side of the rendezvous.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    rank: u32,
    size: u32,
    /// Root: one connection per rank (index 0 unused). Others: the root's, at 0.
    conns: Vec<Option<TcpStream>>,
    /// The address this rank reached the root from (or the root's own).
    local_ip: Option<std::net::IpAddr>,
    watcher: Option<Watcher>,
}

#[derive(Debug)]
struct Watcher {
    stop: Arc<AtomicBool>,
    finishing: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

fn io_err(context: String, source: std::io::Error) -> Error {
    Error::Io { context, source }
}

fn launch_err(message: String) -> Error {
    Error::Launch {
        launcher: "rendezvous",
        message,
    }
}

/// The root's reading of a first frame: a `Join` of this world, or why not.
struct JoinJudge {
    size: u32,
}

impl Judge for JoinJudge {
    fn judge(&mut self, body: &[u8]) -> Verdict {
        match decode_frame(body) {
            Ok(Frame::Join {
                magic,
                version,
                rank,
                size,
            }) => {
                if magic != MAGIC || version != VERSION {
                    Verdict::Refuse(format!("not a fabric-msg rendezvous {VERSION} join"))
                } else if size != self.size {
                    Verdict::Refuse(format!("FABRIC_MSG_SIZE={size} there, {} at rank 0", self.size))
                } else if rank == 0 || rank >= self.size {
                    Verdict::Refuse(format!(
                        "rank {rank} is not a joining rank of a world of {}",
                        self.size
                    ))
                } else {
                    Verdict::Join(rank)
                }
            }
            Ok(other) => Verdict::Refuse(format!("expected Join, got {}", frame_name(&other))),
            Err(e) => Verdict::Refuse(e.to_string()),
        }
    }

    fn refuse(&mut self, s: &mut TcpStream, reason: String) {
        let _ = write_frame(s, &Frame::Reject { reason });
    }
}

/// A world too large for the star, refused before anything is allocated.
pub(crate) fn check_size(size: u32, source: &str) -> Result<()> {
    if size > MAX_RANKS {
        return Err(launch_err(format!(
            "{source} gives {size} ranks; fabric-msg's start-up and liveness star holds one TCP \
             connection per rank at rank 0 and serves at most {MAX_RANKS}: use fewer ranks"
        )));
    }
    Ok(())
}

/// Read one frame before `deadline`. `Ok(None)`: the peer closed cleanly.
fn read_frame(s: &mut TcpStream, deadline: Instant) -> std::io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    if !read_exact_by(s, &mut len, deadline)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("frame of {len} bytes, more than the {MAX_FRAME} allowed"),
        ));
    }
    let mut body = vec![0u8; len];
    if !read_exact_by(s, &mut body, deadline)? {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    decode_frame(&body).map(Some)
}

fn decode_frame(body: &[u8]) -> std::io::Result<Frame> {
    postcard::from_bytes(body)
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("malformed frame ({e})")))
}

/// For the fuzz targets: the bodies of real frames, to mutate.
pub(crate) fn fuzz_seeds() -> Vec<Vec<u8>> {
    let frames = [
        Frame::Join {
            magic: MAGIC,
            version: VERSION,
            rank: 3,
            size: 8,
        },
        Frame::Data { bytes: vec![7; 40] },
        Frame::Table {
            entries: vec![vec![1; 16], vec![2; 16], vec![]],
        },
        Frame::Lost {
            rank: 2,
            why: "its process exited".into(),
        },
        Frame::Done,
    ];
    frames
        .iter()
        .filter_map(|f| postcard::to_stdvec(f).ok())
        .collect()
}

/// For the fuzz targets: a frame decoded as [`read_frame`] does after its
/// length check; whether it decoded.
pub(crate) fn fuzz_frame(body: &[u8]) -> bool {
    body.len() <= MAX_FRAME && decode_frame(body).is_ok()
}

/// Fill `buf` before `deadline` (the whole read, not each `read()`).
/// `Ok(false)`: end of stream before the first byte.
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ErrorKind::TimedOut.into())
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn resolve(root: &str) -> Result<SocketAddr> {
    root.to_socket_addrs()
        .map_err(|e| io_err(format!("FABRIC_MSG_ROOT={root}: cannot resolve it"), e))?
        .next()
        .ok_or_else(|| launch_err(format!("FABRIC_MSG_ROOT={root} resolves to no address")))
}

impl Rendezvous {
    fn new(rank: u32, size: u32) -> Rendezvous {
        Rendezvous {
            rank,
            size,
            conns: (0..size).map(|_| None).collect(),
            local_ip: None,
            watcher: None,
        }
    }

    /// Form the world: the root waits for every rank, the others join it;
    /// both within `timeout`.
    pub(crate) fn start(rank: u32, size: u32, root: &str, timeout: Duration) -> Result<Rendezvous> {
        check_size(size, &format!("FABRIC_MSG_SIZE={size}"))?;
        let addr = resolve(root)?;
        let deadline = Instant::now() + timeout;
        let mut me = Rendezvous::new(rank, size);
        if rank == 0 {
            let listener = TcpListener::bind(addr).map_err(|e| {
                io_err(
                    format!(
                        "rank 0 cannot listen on FABRIC_MSG_ROOT={addr} (is the port in use, or the address \
                         not this host's?)"
                    ),
                    e,
                )
            })?;
            me.serve(listener, addr, deadline, timeout)?;
        } else {
            me.join(addr, deadline, timeout)?;
        }
        Ok(me)
    }

    /// The same connections, for liveness only, in a world another
    /// launcher formed: rank 0 listens on a free port of `bind_ip`, and
    /// `publish` hands its `host:port` (rank 0 gives `Some`) to every rank
    /// and returns rank 0's.
    pub(crate) fn star(
        rank: u32,
        size: u32,
        bind_ip: std::net::IpAddr,
        host: &str,
        publish: impl FnOnce(Option<String>) -> Result<String>,
        timeout: Duration,
    ) -> Result<Rendezvous> {
        check_size(size, "the launcher's job size")?;
        let deadline = Instant::now() + timeout;
        let mut me = Rendezvous::new(rank, size);
        if rank == 0 {
            let listener = TcpListener::bind((bind_ip, 0))
                .map_err(|e| io_err(format!("rank 0 cannot listen on {bind_ip}"), e))?;
            let addr = listener
                .local_addr()
                .map_err(|e| io_err("the liveness listener's address".into(), e))?;
            publish(Some(format!("{host}:{}", addr.port())))?;
            me.serve(listener, addr, deadline, timeout)?;
        } else {
            let root = publish(None)?;
            me.join(resolve(&root)?, deadline, timeout)?;
        }
        Ok(me)
    }

    fn serve(
        &mut self,
        listener: TcpListener,
        addr: SocketAddr,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<()> {
        self.local_ip = Some(addr.ip());
        let mut judge = JoinJudge { size: self.size };
        let admitted = admit(&listener, self.size, deadline, &mut judge)
            .map_err(|e| io_err("rendezvous listener".into(), e))?;
        self.conns = admitted.conns;
        if !admitted.complete {
            let missing: Vec<u32> = (1..self.size)
                .filter(|&r| self.conns[r as usize].is_none())
                .collect();
            let reason = format!(
                "{} did not join within {timeout:?}: were they started, with FABRIC_MSG_ROOT={addr} and \
                 FABRIC_MSG_SIZE={}?{}",
                ranks_text(&missing),
                self.size,
                admitted.turned.describe()
            );
            self.abort_all(&reason);
            return Err(launch_err(reason));
        }
        for r in 1..self.size as usize {
            if let Some(s) = self.conns[r].as_mut() {
                write_frame(s, &Frame::Welcome).map_err(|e| io_err(format!("welcoming rank {r}"), e))?;
            }
        }
        Ok(())
    }

    fn join(&mut self, addr: SocketAddr, deadline: Instant, timeout: Duration) -> Result<()> {
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(io_err(
                        format!(
                            "rank {} could not reach rank 0 at FABRIC_MSG_ROOT={addr} within {timeout:?}: \
                             is rank 0 running?",
                            self.rank
                        ),
                        e,
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _ = s.set_nodelay(true);
        self.local_ip = s.local_addr().ok().map(|a| a.ip());
        let join = Frame::Join {
            magic: MAGIC,
            version: VERSION,
            rank: self.rank,
            size: self.size,
        };
        write_frame(&mut s, &join).map_err(|e| io_err("joining the rendezvous".into(), e))?;
        match read_frame(&mut s, deadline) {
            Ok(Some(Frame::Welcome)) => {}
            Ok(Some(Frame::Reject { reason })) | Ok(Some(Frame::Abort { reason })) => {
                return Err(launch_err(format!("rank 0 refused rank {}: {reason}", self.rank)))
            }
            Ok(Some(other)) => return Err(launch_err(format!("rank 0 sent {}", frame_name(&other)))),
            Ok(None) => return Err(launch_err("rank 0 closed the rendezvous".into())),
            Err(e) => {
                return Err(io_err(
                    format!("waiting for the other ranks to join (within {timeout:?})"),
                    e,
                ))
            }
        }
        self.conns[0] = Some(s);
        Ok(())
    }

    /// The address this rank reaches the others from.
    pub(crate) fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_ip
    }

    /// Every rank's `mine`, by rank.
    pub(crate) fn allgather(&mut self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        if self.rank != 0 {
            let s = self.conns[0]
                .as_mut()
                .ok_or_else(|| launch_err("not joined".into()))?;
            write_frame(s, &Frame::Data { bytes: mine.to_vec() })
                .map_err(|e| io_err("sending to rank 0".into(), e))?;
            return match read_frame(s, deadline) {
                Ok(Some(Frame::Table { entries })) if entries.len() == self.size as usize => Ok(entries),
                Ok(Some(Frame::Abort { reason })) => Err(launch_err(reason)),
                Ok(Some(other)) => Err(launch_err(format!("rank 0 sent {}", frame_name(&other)))),
                Ok(None) => Err(launch_err("rank 0 exited during start-up".into())),
                Err(e) => Err(io_err(
                    format!("waiting for rank 0's table (within {timeout:?})"),
                    e,
                )),
            };
        }
        let mut entries = vec![mine.to_vec()];
        for r in 1..self.size as usize {
            let s = self.conns[r]
                .as_mut()
                .ok_or_else(|| launch_err(format!("rank {r} not joined")))?;
            let got = match read_frame(s, deadline) {
                Ok(Some(Frame::Data { bytes })) => Ok(bytes),
                Ok(Some(other)) => Err(format!("rank {r} sent {}", frame_name(&other))),
                Ok(None) => Err(format!("rank {r} exited during start-up")),
                Err(e) if e.kind() == ErrorKind::TimedOut => {
                    Err(format!("rank {r} did not answer within {timeout:?}"))
                }
                Err(e) => Err(format!("rank {r}: {e}")),
            };
            match got {
                Ok(bytes) => entries.push(bytes),
                Err(reason) => {
                    self.abort_all(&reason);
                    return Err(launch_err(reason));
                }
            }
        }
        for r in 1..self.size as usize {
            if let Some(s) = self.conns[r].as_mut() {
                write_frame(
                    s,
                    &Frame::Table {
                        entries: entries.clone(),
                    },
                )
                .map_err(|e| io_err(format!("sending the table to rank {r}"), e))?;
            }
        }
        Ok(entries)
    }

    /// Tell every other rank the world will not form (root only).
    pub(crate) fn abort_all(&mut self, reason: &str) {
        for s in self.conns.iter_mut().flatten() {
            let _ = write_frame(
                s,
                &Frame::Abort {
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// From now on, watch the connections and record lost ranks in `live`.
    pub(crate) fn watch(&mut self, live: Arc<Liveness>) -> Result<()> {
        let stop = Arc::new(AtomicBool::new(false));
        let finishing = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let mut conns: Vec<(u32, TcpStream)> = Vec::new();
        for (r, s) in self.conns.iter().enumerate() {
            if let Some(s) = s {
                let c = s
                    .try_clone()
                    .map_err(|e| io_err("watching the rendezvous".into(), e))?;
                conns.push((r as u32, c));
            }
        }
        let (st, fi, dn) = (stop.clone(), finishing.clone(), done.clone());
        let root = self.rank == 0;
        let thread = std::thread::Builder::new()
            .name("fabric-msg-liveness".into())
            .spawn(move || watch_loop(root, conns, live, st, fi, dn))
            .map_err(|e| io_err("starting the liveness thread".into(), e))?;
        self.watcher = Some(Watcher {
            stop,
            finishing,
            done,
            thread,
        });
        Ok(())
    }

    /// Leave the world: say `Bye` and wait (up to `timeout`) for the root's
    /// `Done`, which it sends once every rank has said `Bye`, calling
    /// `progress` about every millisecond meanwhile.
    pub(crate) fn finish(&mut self, timeout: Duration, progress: &mut dyn FnMut()) -> Result<()> {
        let Some(w) = self.watcher.take() else {
            return Ok(());
        };
        w.finishing.store(true, Ordering::Release);
        if self.rank != 0 {
            if let Some(s) = self.conns[0].as_mut() {
                let _ = write_frame(s, &Frame::Bye);
            }
        }
        let deadline = Instant::now() + timeout;
        while !w.done.load(Ordering::Acquire) && Instant::now() < deadline && !w.thread.is_finished() {
            progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        let clean = w.done.load(Ordering::Acquire);
        w.stop.store(true, Ordering::Release);
        let _ = w.thread.join();
        if clean {
            Ok(())
        } else {
            // This rank leaves without the world having finished: close its
            // connections now, so the others see it go at once (and report
            // it lost) rather than when this process exits, if it ever does.
            // Rank 0 says why first: the others cannot tell from a close.
            if self.rank == 0 {
                let why = format!(
                    "rank 0 left before every rank had finished (its finish gave up after {timeout:?} \
                     waiting for the others)"
                );
                for s in self.conns.iter_mut().flatten() {
                    let _ = write_frame(
                        s,
                        &Frame::Lost {
                            rank: 0,
                            why: why.clone(),
                        },
                    );
                }
            }
            self.hang_up();
            Err(launch_err(format!(
                "leaving the world: not every rank finished within {timeout:?}"
            )))
        }
    }
}

impl Rendezvous {
    /// Leave without the protocol: stop watching and close every
    /// connection, so the others see this rank go now. After a loss, or a
    /// finish that gave up.
    pub(crate) fn hang_up(&mut self) {
        self.stop_watching();
        for s in self.conns.iter_mut().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn stop_watching(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.stop.store(true, Ordering::Release);
            let _ = w.thread.join();
        }
    }

    /// After a loss, under a launcher that ends the whole job on the first
    /// exit (`mpirun` kills the other ranks within milliseconds of a
    /// non-zero one): keep the connections open until this process exits,
    /// and there leave together with the other survivors (at most
    /// [`LEAVE_TOGETHER`]), so none exits while another has yet to print
    /// its error. The process's exit, not the World's drop: the
    /// application prints its error between the two.
    pub(crate) fn leave_at_exit(&mut self, live: Arc<Liveness>) {
        self.stop_watching();
        let conns: Vec<TcpStream> = self.conns.iter_mut().filter_map(Option::take).collect();
        keep_until_exit(self.rank, conns, live);
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.stop.store(true, Ordering::Release);
            let _ = w.thread.join();
        }
    }
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Join { .. } => "Join",
        Frame::Welcome => "Welcome",
        Frame::Reject { .. } => "Reject",
        Frame::Data { .. } => "Data",
        Frame::Table { .. } => "Table",
        Frame::Abort { .. } => "Abort",
        Frame::Lost { .. } => "Lost",
        Frame::Bye => "Bye",
        Frame::Done => "Done",
    }
}

/// The liveness thread: `poll(2)` on every connection, 50 ms at a time.
fn watch_loop(
    root: bool,
    mut conns: Vec<(u32, TcpStream)>,
    live: Arc<Liveness>,
    stop: Arc<AtomicBool>,
    finishing: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) {
    let mut said_bye = vec![false; conns.len()];
    let mut open = vec![true; conns.len()];
    while !stop.load(Ordering::Acquire) {
        if root && finishing.load(Ordering::Acquire) && said_bye.iter().zip(&open).all(|(b, o)| *b || !*o) {
            for (_, s) in conns.iter_mut() {
                let _ = write_frame(s, &Frame::Done);
            }
            done.store(true, Ordering::Release);
            return;
        }
        let mut fds: Vec<libc::pollfd> = conns
            .iter()
            .map(|(_, s)| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for the call's duration;
        // the sockets stay open (owned by `conns`).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        for (i, fd) in fds.iter().enumerate() {
            if fd.revents == 0 || !open[i] {
                continue;
            }
            let (rank, s) = &mut conns[i];
            let rank = *rank;
            let by = Instant::now() + Duration::from_secs(1);
            match read_frame(s, by) {
                Ok(Some(Frame::Bye)) if root => said_bye[i] = true,
                Ok(Some(Frame::Done)) if !root => {
                    done.store(true, Ordering::Release);
                    return;
                }
                Ok(Some(Frame::Lost { rank: r, why })) if !root => live.lose(r, why),
                Ok(Some(other)) => {
                    log::warn!("rendezvous: unexpected {} from rank {rank}", frame_name(&other))
                }
                Ok(None) | Err(_) => {
                    open[i] = false;
                    // Done has not been sent (the loop ends when it is), so
                    // even a rank that said Bye left before the world
                    // finished: its finish gave up, or it exited.
                    let why = if root && said_bye[i] {
                        format!(
                            "rank {rank} left before every rank had finished (it said Bye, then closed its \
                             connection to rank 0: its finish timed out waiting for the others, or its process \
                             exited)"
                        )
                    } else if root {
                        format!("rank {rank} closed its connection to rank 0 without finishing: its process exited or was killed")
                    } else {
                        "rank 0 closed its connection without finishing: its process exited or was killed"
                            .to_string()
                    };
                    live.lose(rank, why.clone());
                    if root {
                        for (j, (_, other)) in conns.iter_mut().enumerate() {
                            if j != i && open[j] {
                                let _ = write_frame(
                                    other,
                                    &Frame::Lost {
                                        rank,
                                        why: why.clone(),
                                    },
                                );
                            }
                        }
                    } else {
                        return;
                    }
                }
            }
        }
    }
}
