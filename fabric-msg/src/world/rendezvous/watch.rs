//! The rendezvous' connections once the world has formed: the liveness
//! thread that watches them (`fabric-msg-liveness`, one of the parts of
//! peer-loss detection listed in `transport/liveness/`), and leaving the
//! world, in order (`Bye`, `Done`) or not.

use super::frame::{frame_name, read_frame, Frame};
use super::{io_err, launch_err, Rendezvous, Watcher};
use crate::error::Result;
use crate::transport::framing::write_frame;
use crate::world::leaving::keep_until_exit;
use crate::world::liveness::Liveness;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Rendezvous {
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
                    if root {
                        // Tell the others first: recording the loss wakes
                        // this rank's own calls, and a program that then
                        // exits at once would close these connections
                        // before the notice went out, so the others would
                        // blame rank 0 instead of `rank`.
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
                        live.lose(rank, why);
                    } else {
                        live.lose(rank, why);
                        return;
                    }
                }
            }
        }
    }
}
