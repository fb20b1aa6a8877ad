//! A receive of the node loop paired with one on another loop: the
//! World's receive from any rank, posted here and on the fabric. Before a
//! message goes to it, the loop asks its owner, and the message waits in
//! its ring (with the ones behind it) until the owner answers: it takes
//! the receive back ([`NodeLoop::cancel_recv`]), as the other part took or
//! is taking a message, or lets it take messages like any other
//! ([`NodeLoop::unpair`]), as the other part was cancelled. So which part
//! gets a message is settled before the next message is matched, and one
//! rank's messages keep their order across the two loops (MPICH's CH4
//! settles its shared-memory and network halves of such a receive the
//! same way). The owner's side: `world/local/claims.rs`.

use super::lent::Mem;
use super::node_loop::NodeLoop;
use crate::error::Result;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::Token;

impl NodeLoop {
    /// [`NodeLoop::recv`] from any rank for a receive that waits on
    /// another loop too (`matching.rs`, "paired"): true if a message that
    /// arrived before it matched it now (it completes at the next poll, and
    /// the other part need not be posted); false if it is posted, and
    /// every message that would go to it waits until the owner answers
    /// ([`NodeLoop::take_asked`]) with [`NodeLoop::unpair`] or
    /// [`NodeLoop::cancel_recv`].
    pub fn recv_paired(&mut self, tag: u64, ignore: u64, mut buf: Buffer, token: Token) -> Result<bool> {
        buf.set_len(buf.capacity());
        self.post(None, tag, ignore, Mem::Owned(buf), token, true)
    }

    /// The paired receives a message waits for an answer about, appended
    /// to `out`: each once a look, at every look until it is answered.
    pub fn take_asked(&mut self, out: &mut Vec<Token>) {
        self.matcher.take_asked(out);
    }

    /// The paired receive `token` takes messages as any other receive
    /// from now on. False if it is not posted.
    pub fn unpair(&mut self, token: Token) -> bool {
        self.matcher.unpair(token)
    }
}
