//! Connection bootstrap over a plain TCP socket, out of band.
//!
//! A [`Listener`] and [`connect`] exchange, in postcard frames prefixed
//! with a little-endian `u32` length:
//!
//! 1. client → server: `Hello { magic, version, profile, name, nonce: 0 }`
//! 2. server → client: its own `Hello` (on connected endpoints: its passive
//!    endpoint's name and a fresh random `nonce`), or `Reject { reason }`
//! 3. client → server: `Ready` once it can take messages from the server
//!    (RDM: the server's name is in its address vector and its receives
//!    are posted; MSG: its `fi_connect`, carrying the nonce as connection
//!    data, completed), or `Reject { reason }`
//! 4. server → client: `Ready` once it can take messages from the client.
//!
//! Each side checks the other's [`WireProfile`](crate::discovery::profile::WireProfile) with [`check_peer`](crate::discovery::profile::check_peer) and, if
//! it does not fit, tells the other why before failing, so both report the
//! same mismatch. Frames larger than [`MAX_FRAME`] are refused before any
//! allocation, and the whole handshake has one deadline on each side.
//!
//! The server touches its event loop only at step 4 (RDM: the client's
//! name goes into the address vector) or when a connection request
//! carrying a pending handshake's nonce arrives (MSG), so a peer that
//! stops half way leaves nothing behind. On MSG a connection request
//! without a pending handshake's nonce is refused (`fi_reject`): a third
//! party cannot take a handshaking client's place.
//!
//! The listener's side is in `listener` (the socket, the bound, the
//! polling) and `handshake` (one handshake's state machine); the client's
//! in `client`; the frames and the checks both sides share in `protocol`
//! (frames are read and written by `transport/framing.rs`); and where
//! a finished handshake's stream goes in `done`: it stays open as the
//! peer's lifeline, on which its death or stall is noticed
//! ([`liveness`](super::liveness)).

mod client;
mod done;
mod handshake;
mod listener;
mod protocol;

pub use client::{connect, connect_with};
pub use listener::{Accepted, Listener, Refusal, DEFAULT_MAX_IN_PROGRESS};
pub(crate) use protocol::{fuzz_frame, fuzz_seeds};
pub use protocol::{DEFAULT_TIMEOUT, MAX_FRAME};
