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
//! Frames (`frame.rs`): a little-endian `u32` length, then postcard, at
//! most [`MAX_FRAME`](frame::MAX_FRAME) bytes, refused before any allocation
//! (`transport/framing.rs`); every read has a deadline. The liveness
//! thread that watches the connections once the world has formed, and
//! leaving the world, are in `watch.rs`.

mod frame;
mod watch;

use super::admission::{admit, ranks_text};
use crate::error::{Error, Result};
use crate::transport::framing::write_frame;
use frame::{frame_name, read_frame, Frame, JoinJudge, MAGIC, VERSION};
pub(crate) use frame::{fuzz_frame, fuzz_seeds};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most ranks the star at rank 0 serves: one TCP connection (one file
/// descriptor) per rank, and a table of every rank's address within
/// [`MAX_FRAME`](frame::MAX_FRAME). Checked before anything is sized by
/// the rank count.
pub(crate) const MAX_RANKS: u32 = 1 << 14;

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

/// The liveness thread of a formed world (`watch.rs`).
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
}
