//! Broadcast. Three algorithms, chosen by bytes and ranks:
//!
//! - **linear** for short messages to at most 8 ranks: the root sends to
//!   every rank. A rank then waits for the root only, never for a rank that
//!   forwards: on a node with more ranks than cores the forwarding rank is
//!   often not running (measured here at 4 and 8 ranks on 2 cores: the
//!   slowest rank's time fell several-fold against the tree).
//! - **binomial tree** for short messages to more ranks: virtual rank `v`
//!   (ranks renumbered so the root is 0) receives the whole message from
//!   `v - lowbit(v)` and forwards it to `v + 2^k` for every `2^k < lowbit(v)`,
//!   largest subtree first: ⌈log2 size⌉ rounds.
//! - **scatter + ring allgather** (van de Geijn) for long messages to 16
//!   ranks or more: the root
//!   cuts the message into one piece per rank and scatters the pieces down
//!   the same binomial tree (each subtree gets only its pieces), then the
//!   ranks pass pieces around a ring until each has all. The root sends
//!   about the message once instead of ⌈log2 size⌉ times.

use super::schedule::{children, parent, ring_allgather, subtree, xfer, Blocks, Rotation, Round, Schedule};
use smallvec::smallvec;

/// Bytes from which a broadcast scatters and allgathers.
pub(crate) const SCATTER_MIN_BYTES: usize = 12 << 10;
/// Ranks from which a long broadcast scatters and allgathers. MPICH
/// switches at 8 ranks; here, with 4 and 8 ranks on 2 cores, the binomial
/// tree was faster at 1 MiB (shm 1.0-4x, tcp;ofi_rxm 1.3-3x): the ring's
/// p - 1 extra rounds each wait for a neighbour to be scheduled.
pub(crate) const SCATTER_MIN_RANKS: u32 = 16;
/// Most ranks a short broadcast goes to straight from the root.
pub(crate) const LINEAR_MAX_RANKS: u32 = 8;

/// Which algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Linear,
    Binomial,
    ScatterAllgather,
}

/// The algorithm for `bytes` over `size` ranks.
pub(crate) fn choose(bytes: usize, n: usize, size: u32) -> Algorithm {
    if bytes >= SCATTER_MIN_BYTES && size >= SCATTER_MIN_RANKS && n >= size as usize {
        Algorithm::ScatterAllgather
    } else if size <= LINEAR_MAX_RANKS {
        Algorithm::Linear
    } else {
        Algorithm::Binomial
    }
}

/// Rank `rank`'s rounds for a broadcast of `n` elements from `root`.
pub(crate) fn schedule(rank: u32, size: u32, root: u32, n: usize, algo: Algorithm) -> Schedule {
    let rot = Rotation { root, size };
    let v = rot.virt(rank);
    let mut s = Schedule::default();
    match algo {
        Algorithm::Linear => {
            if rank == root {
                s.push(Round {
                    sends: (1..size).map(|v| xfer(rot.real(v), 0, 0, n)).collect(),
                    recvs: smallvec![],
                });
            } else {
                s.recv(xfer(root, 0, 0, n));
            }
        }
        Algorithm::Binomial => {
            if v != 0 {
                s.recv(xfer(rot.real(parent(v)), 0, 0, n));
            }
            s.push(Round {
                sends: children(v, size).map(|c| xfer(rot.real(c), 0, 0, n)).collect(),
                recvs: smallvec![],
            });
        }
        Algorithm::ScatterAllgather => {
            // Piece u (in virtual-rank order) is block u of the message.
            let pieces = Blocks::even(n, size);
            let region = |u: u32| {
                let end = (u + subtree(u, size)) as usize;
                (pieces.at(u as usize), pieces.span(u as usize, end))
            };
            if v != 0 {
                let (at, len) = region(v);
                s.recv(xfer(rot.real(parent(v)), 0, at, len));
            }
            s.push(Round {
                sends: children(v, size)
                    .map(|c| {
                        let (at, len) = region(c);
                        xfer(rot.real(c), 0, at, len)
                    })
                    .collect(),
                recvs: smallvec![],
            });
            ring_allgather(&mut s, v, size, &pieces, |u| rot.real(u), 1);
        }
    }
    s
}
