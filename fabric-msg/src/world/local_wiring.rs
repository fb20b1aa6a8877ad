//! Opening and wiring a same-node loop at start-up (`startup.rs` calls
//! these): libfabric's shm endpoint and its peers, or the node loop
//! connected to the segments the other ranks of the node published.

use super::lane::{NodeSide, Side};
use super::local::{Local, Published};
use crate::discovery::config::LadderConfig;
use crate::discovery::negotiate::{negotiate, Requirements};
use crate::discovery::profile::check_peer;
use crate::error::{Error, Result};
use crate::transport::event_loop::idle::Idler;
use crate::transport::event_loop::{EndpointId, EventLoop, LoopConfig, Peer};
use crate::transport::node::NodeLoop;

/// Open the shared-memory loop and its endpoint; its name.
pub(crate) fn open(
    req: &Requirements,
    ladder: &LadderConfig,
    cfg: LoopConfig,
) -> Result<(EventLoop, EndpointId, Vec<u8>)> {
    let only = Requirements {
        provider: Some("shm".into()),
        provider_layered: false,
        same_host: true,
        domain: None,
        ..req.clone()
    };
    let profile = negotiate(&only, ladder)?.profile;
    if profile.provider != "shm" {
        return Err(Error::Usage(format!("asked for shm, got {}", profile.provider)));
    }
    let mut ev = EventLoop::new(&profile, cfg)?;
    ev.reserve_world_classes();
    let ep = ev.open_endpoint()?;
    let name = ev.endpoint_name(ep)?;
    Ok((ev, ep, name))
}

impl Local {
    /// Wire the shm loop to the ranks in `ranks` (by their published
    /// names); `None` if there are none.
    pub(crate) fn wire(
        mut ev: EventLoop,
        ep: EndpointId,
        size: u32,
        me: u32,
        ranks: &[u32],
        table: &[Published],
    ) -> std::result::Result<Option<Local>, String> {
        if ranks.is_empty() {
            return Ok(None);
        }
        let own = ev.wire_profile();
        let idle_cfg = ev.cfg.clone();
        let mut names = Vec::with_capacity(ranks.len());
        let mut agreements = Vec::with_capacity(ranks.len());
        for &r in ranks {
            let Ok((name, wire)) = &table[r as usize].local else {
                return Err(format!("rank {r} published no shm endpoint"));
            };
            let a = check_peer(&own, wire).map_err(|e| format!("rank {r} over shm: {e}"))?;
            if a.tag_bits < 64 {
                return Err(format!(
                    "rank {r} over shm: {} tag bits; the world needs 64",
                    a.tag_bits
                ));
            }
            names.push(name.clone());
            agreements.push(a);
        }
        let inserted = ev
            .insert_peers(ep, &names, &agreements)
            .map_err(|e| format!("inserting the shm peers: {e}"))?;
        let mut peers: Vec<Option<Peer>> = (0..size).map(|_| None).collect();
        for (&r, p) in ranks.iter().zip(inserted) {
            peers[r as usize] = Some(p);
        }
        Ok(Some(Local::new(
            Side::Shm { ev, ep, peers },
            size,
            me,
            Idler::new(&idle_cfg),
        )))
    }

    /// Connect the node loop to the ranks in `ranks` (by their published
    /// segments) and to this rank `me` itself (its messages to itself go
    /// through its own ring too); `node_ranks`: every rank of this node,
    /// ascending, whose places are their node indices. `None` if there are
    /// no others.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wire_node(
        mut nl: NodeLoop,
        size: u32,
        me: u32,
        node_ranks: &[u32],
        ranks: &[u32],
        table: &[Published],
        idle_cfg: &LoopConfig,
    ) -> std::result::Result<Option<Local>, String> {
        if ranks.is_empty() {
            return Ok(None);
        }
        let own = nl.name();
        nl.connect(nl.me(), &own)
            .map_err(|e| format!("connecting to this rank's own segment: {e}"))?;
        for &r in ranks {
            let Ok(name) = &table[r as usize].node else {
                return Err(format!("rank {r} published no node segment"));
            };
            let Some(i) = node_ranks.iter().position(|&n| n == r) else {
                return Err(format!("rank {r} is not on this rank's node"));
            };
            nl.connect(i, name).map_err(|e| {
                format!(
                    "connecting to rank {r}'s same-node segment: {e}. Run with FABRIC_MSG_SHM=libfabric to use \
                     libfabric's shm between these ranks instead"
                )
            })?;
        }
        let mut carried = ranks.to_vec();
        carried.push(me);
        let side = Side::Node(NodeSide::new(nl, size, node_ranks, &carried));
        Ok(Some(Local::new(side, size, me, Idler::new(idle_cfg))))
    }
}
