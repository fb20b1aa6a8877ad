//! What a [`World`](super::World) asks for, and the environment variables
//! that set it without recompiling.

use crate::discovery::config::LadderConfig;
use crate::discovery::negotiate::{Capability, Requirements};
use crate::error::{Error, Result};
use crate::transport::event_loop::{LoopConfig, ProgressThread, WaitMode};
use crate::transport::node::DEFAULT_SINGLE_COPY_FROM;
use std::time::Duration;

/// Settings of a [`World`](super::World). `WorldConfig::default()`:
///
/// | field | default | environment |
/// |---|---|---|
/// | `requirements` | tagged + untagged messages, RMA and atomics (for [`World::alloc_symmetric`](super::World::alloc_symmetric); atomics are native where the provider has them, emulated otherwise, and never change the fabric chosen); the World always asks for RDM endpoints and sets `same_host` and `max_peers` itself | |
/// | `ladder` | `None`: `providers.toml` as [`LadderConfig::load`] finds it | `FABRIC_MSG_PROVIDERS` |
/// | `loop_config` | `LoopConfig::default()`, but waits are [`WaitMode::Adaptive`] (spin, then yield; on a node with more ranks than cores, yield, then sleep on the CQ's fd after 2 ms: `docs/world.md`, "Waiting") and a progress thread runs where the fabric needs one for peers' one-sided operations ([`ProgressThread::WhereNeeded`]) | `FABRIC_MSG_WAIT=spin`, `block` or `adaptive`; `FABRIC_MSG_PROGRESS_THREAD=0` turns the thread off, `=1` asks for one wherever the domain allows |
/// | `domain` | `None`: on IP fabrics, the interface that reaches rank 0 | `FABRIC_MSG_DOMAIN` |
/// | `shared_memory` | `true`: `shm` when every rank is on one host (for one-sided operations), and shared memory between the ranks of one node for messages | `FABRIC_MSG_SHM=0` turns both off |
/// | `node_transport` | `true`: ranks of one node exchange messages over fabric-msg's own rings (`transport/node`, docs/onnode.md); `false`: over libfabric's `shm` where the world's fabric is another, over the world's `shm` where it is `shm` | `FABRIC_MSG_SHM=libfabric` sets `false`, `FABRIC_MSG_SHM=node` (or 1) `true` |
/// | `node_collectives` | `true`: where every rank is on one node and the node transport carries them, the blocking barrier, allreduce, broadcast and reduce on the World go through shared-memory slots (`world/collectives/on_node.rs`); `false`: as messages | `FABRIC_MSG_NODE_COLLECTIVES=0` sets `false` |
/// | `one_engine` | `true`: in a World that spans nodes over the node transport, every application message, the fabric's too, is matched in the node loop's one matching engine (`world/local/engine.rs`; docs/world.md, "One matching engine"). Taken where every rank asks for it and the fabric's masked receives match as they should (not on libfabric 1.17's shm); `false`: a receive from any rank waits on the node loop and on the fabric, and the first to get a message cancels the other (`world/local/claims.rs`) | `FABRIC_MSG_ONE_ENGINE=0` sets `false` |
/// | `single_copy_from` | 32 KiB: messages between ranks of one node of at least this many bytes are read by the receiver from the sender's memory in one copy (`process_vm_readv`) instead of streaming through the ring; which is faster depends on the machine (docs/onnode.md, "Large messages": measure with `node_pingpong --copy-from`). Collectives larger than a slot read by one copy whatever this says | `FABRIC_MSG_SINGLE_COPY_FROM=BYTES` or `never` |
/// | `node` | `None`: the host name says which ranks share a node | `FABRIC_MSG_NODE` (for testing layouts: one machine standing in for several nodes) |
/// | `start_timeout` | 30 s: for all ranks to arrive and agree | `FABRIC_MSG_START_TIMEOUT` (seconds) |
/// | `finish_timeout` | 10 s: for all ranks to finish | `FABRIC_MSG_FINISH_TIMEOUT` (seconds) |
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// What the application needs of the fabric.
    pub requirements: Requirements,
    /// The ladder; `None` loads `providers.toml` (or the built-in default).
    pub ladder: Option<LadderConfig>,
    /// Tuning of the rank's event loop.
    pub loop_config: LoopConfig,
    /// Only this domain (interface or device), overriding the choice of
    /// the interface that reaches the other ranks.
    pub domain: Option<String>,
    /// Use shared memory when every rank is on this host, and between
    /// ranks of one node beside another fabric.
    pub shared_memory: bool,
    /// Messages between ranks of one node over fabric-msg's own
    /// transport; `false`: over libfabric's `shm`.
    pub node_transport: bool,
    /// The World's small blocking collectives through shared memory where
    /// every rank is on one node (over the node transport).
    pub node_collectives: bool,
    /// Match every application message, the fabric's too, in the node
    /// loop's one matching engine, in a World that spans nodes (where
    /// every rank asks for it).
    pub one_engine: bool,
    /// Messages between ranks of one node of at least this many bytes go
    /// by one copy, where the kernel lets the receiver read the sender
    /// (`usize::MAX`: never).
    pub single_copy_from: usize,
    /// This rank's node, in place of its host name, to lay ranks out on
    /// pretend nodes in tests. Set, the launcher's word that every rank is
    /// on this host no longer makes the world choose `shm`.
    pub node: Option<String>,
    /// Longest wait for every rank to arrive and agree on a fabric.
    pub start_timeout: Duration,
    /// Longest wait, when finishing, for the other ranks to finish.
    pub finish_timeout: Duration,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            requirements: Requirements {
                caps: vec![
                    Capability::Tagged,
                    Capability::Msg,
                    Capability::Rma,
                    Capability::Atomic,
                ],
                ..Requirements::default()
            },
            ladder: None,
            loop_config: LoopConfig {
                wait: WaitMode::Adaptive,
                yield_before_block: None,
                progress_thread: ProgressThread::WhereNeeded,
                ..LoopConfig::default()
            },
            domain: None,
            shared_memory: true,
            node_transport: true,
            node_collectives: true,
            one_engine: true,
            single_copy_from: DEFAULT_SINGLE_COPY_FROM,
            node: None,
            start_timeout: Duration::from_secs(30),
            finish_timeout: Duration::from_secs(10),
        }
    }
}

fn seconds(name: &str) -> Result<Option<Duration>> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| Error::Usage(format!("{name}={v:?}: give a number of seconds above 0"))),
        _ => Ok(None),
    }
}

impl WorldConfig {
    /// The defaults, with what the environment variables in the table say.
    pub fn from_env() -> Result<WorldConfig> {
        let mut c = WorldConfig::default();
        if let Ok(d) = std::env::var("FABRIC_MSG_DOMAIN") {
            c.domain = Some(d).filter(|d| !d.is_empty());
        }
        match std::env::var("FABRIC_MSG_SHM").as_deref() {
            Ok("0") | Ok("off") | Ok("no") | Ok("false") => c.shared_memory = false,
            Ok("libfabric") => c.node_transport = false,
            Ok("1") | Ok("on") | Ok("yes") | Ok("true") | Ok("node") | Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(Error::Usage(format!(
                    "FABRIC_MSG_SHM={other:?}: say 0 (no shared memory), libfabric (libfabric's shm between the \
                     ranks of a node) or node (fabric-msg's own transport, the default)"
                )));
            }
        }
        match std::env::var("FABRIC_MSG_NODE_COLLECTIVES").as_deref() {
            Ok("0") | Ok("off") | Ok("no") | Ok("false") => c.node_collectives = false,
            Ok("1") | Ok("on") | Ok("yes") | Ok("true") | Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(Error::Usage(format!(
                    "FABRIC_MSG_NODE_COLLECTIVES={other:?}: say 0 (collectives as messages) or 1 (the default)"
                )));
            }
        }
        match std::env::var("FABRIC_MSG_ONE_ENGINE").as_deref() {
            Ok("0") | Ok("off") | Ok("no") | Ok("false") => c.one_engine = false,
            Ok("1") | Ok("on") | Ok("yes") | Ok("true") => c.one_engine = true,
            Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(Error::Usage(format!(
                    "FABRIC_MSG_ONE_ENGINE={other:?}: say 1 (every application message matched in one engine) or 0"
                )));
            }
        }
        match std::env::var("FABRIC_MSG_SINGLE_COPY_FROM").as_deref() {
            Ok("never") => c.single_copy_from = usize::MAX,
            Ok("") | Err(_) => {}
            Ok(v) => {
                c.single_copy_from = v.trim().parse().map_err(|_| {
                    Error::Usage(format!(
                        "FABRIC_MSG_SINGLE_COPY_FROM={v:?}: give a number of bytes (messages between ranks of one \
                         node at least that long are read in one copy; 32768 by default) or never (always through the ring)"
                    ))
                })?
            }
        }
        if let Ok(n) = std::env::var("FABRIC_MSG_NODE") {
            c.node = Some(n).filter(|n| !n.is_empty());
        }
        match std::env::var("FABRIC_MSG_WAIT").as_deref() {
            Ok("spin") => c.loop_config.wait = WaitMode::Spin,
            Ok("block") => c.loop_config.wait = WaitMode::Block,
            Ok("adaptive") | Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(Error::Usage(format!(
                    "FABRIC_MSG_WAIT={other:?}: say spin, block or adaptive (the default)"
                )));
            }
        }
        match std::env::var("FABRIC_MSG_PROGRESS_THREAD").as_deref() {
            Ok("0") | Ok("off") | Ok("no") | Ok("false") => {
                c.loop_config.progress_thread = ProgressThread::Off
            }
            Ok("1") | Ok("on") | Ok("yes") | Ok("true") => c.loop_config.progress_thread = ProgressThread::On,
            Ok("") | Err(_) => {}
            Ok(other) => {
                return Err(Error::Usage(format!(
                    "FABRIC_MSG_PROGRESS_THREAD={other:?}: say 0 or 1 (unset: where the fabric needs one)"
                )));
            }
        }
        if let Some(t) = seconds("FABRIC_MSG_START_TIMEOUT")? {
            c.start_timeout = t;
        }
        if let Some(t) = seconds("FABRIC_MSG_FINISH_TIMEOUT")? {
            c.finish_timeout = t;
        }
        Ok(c)
    }
}
