//! Helpers of `World::init`: the exchanges, each rank's own negotiation,
//! and what the host says of itself (its name, its interfaces, its cores).

use super::config::WorldConfig;
use super::state::World;
use crate::discovery::classify::FabricKind;
use crate::discovery::negotiate::{negotiate, EndpointChoice, Requirements};

use super::agree::{decide, Choice, ChosenRung};
use super::collectives::engine::Engine;
use super::collectives::on_node::NodeColl;
use super::collectives::scope::ContextPool;
use super::lane::Side;
use super::launch::Launcher;
use super::liveness::Liveness;
use super::local::{Local, Published};
use crate::discovery::config::LadderConfig;
use crate::discovery::profile::{check_peer, Profile};
use crate::error::{Error, Result};
use crate::transport::event_loop::idle::Idler;
use crate::transport::event_loop::{EventLoop, WaitMode};
use crate::transport::node::{NodeConfig, NodeLoop};
use std::sync::Arc;
use std::time::Duration;

impl World {
    /// Join the world this process was launched into, with
    /// [`WorldConfig::from_env`].
    pub fn init() -> Result<World> {
        World::init_with(WorldConfig::from_env()?)
    }

    /// Join the world with explicit settings.
    pub fn init_with(cfg: WorldConfig) -> Result<World> {
        crate::error::logging::init_from_env();
        // Where start-up goes, at debug level (FABRIC_MSG_LOG_LEVEL=debug):
        // docs/world.md, "Start-up cost".
        let t0 = std::time::Instant::now();
        let phase = |name: &str| {
            let ms = t0.elapsed().as_millis() as u64;
            log::debug!(op = "startup", phase = name, ms = ms; "start-up: {name} after {ms} ms");
        };
        let (mut launcher, placement) = Launcher::detect(cfg.start_timeout)?;
        phase("launcher");
        crate::error::logging::set_rank(placement.rank);
        let size = placement.size;
        let ladder = match cfg.ladder.clone() {
            Some(l) => l,
            None => LadderConfig::load(None)?,
        };
        let loop_config = waits_for(cfg.loop_config.clone(), placement.local_ranks.len());
        let mut req = cfg.requirements.clone();
        req.endpoint = EndpointChoice::Rdm;
        // FABRIC_MSG_NODE lays ranks out on pretend nodes: the launcher's
        // "all on this host" no longer holds.
        req.same_host =
            cfg.shared_memory && cfg.node.is_none() && placement.local_ranks.len() == size as usize;
        req.max_peers = req.max_peers.max(size as usize);
        let domain = cfg.domain.clone().or_else(|| interface_of(launcher.local_ip()));

        // Round 1: every rank's first choice; the world takes the worst.
        let mine = first_choice(&req, &ladder, domain.as_deref());
        phase("negotiated");
        let choice = Choice {
            host: super::same_node::node_name(cfg.node.as_deref(), hostname()),
            rung: mine
                .as_ref()
                .map(|p| ChosenRung::of(p, &ladder))
                .map_err(|e| e.to_string()),
        };
        let table = exchange(&mut launcher, "fabric-msg.choice", &choice, cfg.start_timeout)?;
        phase("choices exchanged");
        let nodes: Vec<String> = table.iter().map(|c| c.host.clone()).collect();
        let decision = decide(&table).map_err(|message| Error::Launch {
            launcher: launcher.name(),
            message,
        })?;
        let profile = match mine {
            Ok(p) if p.rung == decision.rung.label => Ok(p),
            _ => open_rung(&req, &ladder, domain.as_deref(), &decision.rung),
        };

        // Round 2: every rank's endpoint name and profile, or why it has none.
        let opened = profile.and_then(|p| {
            let mut ev = EventLoop::new(&p, loop_config.clone())?;
            // The collectives' classes are the World's alone (event_loop()
            // hands this loop to the application).
            ev.reserve_world_classes();
            let ep = ev.open_endpoint()?;
            let name = ev.endpoint_name(ep)?;
            Ok((ev, ep, name))
        });
        phase("loop opened");
        let main = match &opened {
            Ok((ev, _, name)) => Ok((name.clone(), ev.wire_profile())),
            Err(e) => Err(format!("cannot open {}: {e}", decision.rung.label)),
        };
        // And, beside ranks on its node, its shared-memory endpoint.
        let not_wanted = super::same_node::wanted(
            cfg.shared_memory,
            cfg.node_transport,
            &decision.rung.provider,
            &nodes,
            placement.rank,
        );
        let node_ranks = super::same_node::node_ranks(placement.rank, &nodes);
        let (shm, node) = match not_wanted {
            Some(why) => (Err(why.clone()), Err(why)),
            None if cfg.node_transport => {
                let me = node_ranks.iter().position(|&r| r == placement.rank).unwrap_or(0);
                let node_cfg = NodeConfig {
                    single_copy_from: cfg.single_copy_from,
                    ..NodeConfig::default()
                };
                let nl = NodeLoop::create(me, node_ranks.len(), node_cfg)
                    .map_err(|e| format!("cannot create the same-node segment: {e}"));
                (Err("fabric-msg's node transport is used".into()), nl)
            }
            None => (
                super::local_wiring::open(&req, &ladder, loop_config.clone())
                    .map_err(|e| format!("cannot open shm: {e}")),
                Err("libfabric's shm is used (FABRIC_MSG_SHM=libfabric)".into()),
            ),
        };
        phase("same-node loop opened");
        let mine = Published {
            main,
            local: match &shm {
                Ok((ev, _, name)) => Ok((name.clone(), ev.wire_profile())),
                Err(why) => Err(why.clone()),
            },
            node: match &node {
                Ok(nl) => Ok(nl.name()),
                Err(why) => Err(why.clone()),
            },
            // Its masked receives on the fabric must match as they should
            // (libfabric 1.17's shm's do not: `Profile::tag_mask_defect`).
            one_engine: cfg.one_engine
                && opened
                    .as_ref()
                    .is_ok_and(|(ev, _, _)| ev.profile().tag_mask_defect.is_none()),
        };
        let table = exchange(&mut launcher, "fabric-msg.address", &mine, cfg.start_timeout)?;
        phase("addresses exchanged");
        let launch_error = |message: String| Error::Launch {
            launcher: launcher.name(),
            message,
        };
        if let Some((r, why)) = table
            .iter()
            .enumerate()
            .find_map(|(r, t)| t.main.as_ref().err().map(|w| (r, w)))
        {
            return Err(launch_error(format!("rank {r} {why}")));
        }
        let (mut ev, ep, _) = opened?;
        let local = ev.wire_profile();
        let mut names = Vec::with_capacity(table.len());
        let mut agreements = Vec::with_capacity(table.len());
        for (r, entry) in table.iter().enumerate() {
            let (name, wire) = entry.main.clone().map_err(&launch_error)?;
            let agreement = check_peer(&local, &wire).map_err(|e| launch_error(format!("rank {r}: {e}")))?;
            if agreement.tag_bits < 64 {
                return Err(launch_error(format!(
                    "rank {r}: the fabric honours {} tag bits; the world needs 64",
                    agreement.tag_bits
                )));
            }
            names.push(name);
            agreements.push(agreement);
        }
        let peers = ev.insert_peers(ep, &names, &agreements)?;
        let has: Vec<bool> = table
            .iter()
            .map(|p| {
                if node.is_ok() {
                    p.node.is_ok()
                } else {
                    p.local.is_ok()
                }
            })
            .collect();
        let pairs = super::same_node::pairs_of(placement.rank, &nodes, &has);
        let node_published: Vec<bool> = table.iter().map(|p| p.node.is_ok()).collect();
        let two_level = super::same_node::two_levels(&nodes, &node_published);
        // One matching engine where every rank asked for it and the World
        // spans nodes over the node transport: then every rank with others
        // on its node runs it.
        let engine_ranks: Option<Vec<bool>> =
            (two_level && table.iter().all(|p| p.one_engine)).then(|| super::same_node::with_others(&nodes));
        let report = |wired: &Option<Local>, how: &str| match wired {
            Some(_) => super::same_node::report(placement.rank, &pairs, how, &decision.rung.label),
            None => format!("no other rank on this node uses {how}"),
        };
        let (mut shm, mut shm_report) = match (shm, node) {
            (Ok((lev, lep, _)), _) => {
                let wired =
                    Local::wire(lev, lep, size, placement.rank, &pairs, &table).map_err(&launch_error)?;
                let r = report(&wired, "libfabric's shm");
                (wired, r)
            }
            (_, Ok(nl)) => {
                let wired = Local::wire_node(
                    nl,
                    size,
                    placement.rank,
                    &node_ranks,
                    &pairs,
                    &table,
                    &loop_config,
                )
                .map_err(&launch_error)?;
                let r = report(&wired, "fabric-msg's node transport");
                (wired, r)
            }
            (Err(why), Err(_)) => (None, why),
        };
        if let (Some(l), Some(e)) = (shm.as_mut(), &engine_ranks) {
            if e[placement.rank as usize] {
                l.start_engine(&mut ev, ep)?;
                shm_report
                    .push_str("; every application message, the fabric's too, is matched in one engine");
            }
        }
        let announcer = engine_ranks
            .as_ref()
            .map(|e| super::announce::Announcer::new(e, &node_ranks));
        let node_coll = shm
            .as_ref()
            .filter(|_| cfg.node_collectives)
            .and_then(|l| l.side.slots_of_all(placement.size))
            .map(|slots| {
                let spin = !oversubscribed(placement.size as usize);
                NodeColl::new(slots, placement.rank, spin, Idler::new(&loop_config))
            });
        let live = Arc::new(Liveness::new(placement.rank, local.provider.clone()));
        // A send stuck on a queue full of messages for a rank that died
        // fails with that rank's loss at once, not after post_timeout.
        ev.give_up_when(live.flag());
        if let Some(Side::Shm { ev, .. }) = shm.as_mut().map(|l| &mut l.side) {
            ev.give_up_when(live.flag());
        }
        let mut world = World {
            ev,
            ep,
            peers,
            local: shm,
            announcer,
            shm_report,
            placement,
            node_ranks,
            launcher,
            live,
            report: decision.why,
            finish_timeout: cfg.finish_timeout,
            finished: false,
            coll: Engine::new(Idler::new(&loop_config)),
            contexts: Arc::new(ContextPool::new()),
            msgs: Default::default(),
            one_sided: Default::default(),
            node_coll,
            slot_requests: Default::default(),
            node_collectives: cfg.node_collectives,
            slot_calls: 0,
            single_copy_calls: 0,
            two_level: None,
            two_level_calls: 0,
            two_level_requests: 0,
            chains: Vec::new(),
            moved: 0,
        };
        let (engine, mut io) = world.engine_io();
        engine.listen(&mut io)?;
        // Round 3, empty: every rank is wired (peers in its AV, its
        // failure notices' receive posted) before any rank starts a
        // collective. Without it a rank still wiring could get a notice
        // before its receive (libfabric 1.17's shm then let the masked
        // receive miss it) or before the sender was in its AV (its source
        // unknown, the notice dropped as forged): 1 in about 40 runs of
        // `collectives_check --bad-op` left rank 0 waiting for 10 s.
        // Before the launcher's connections become liveness's (the
        // rendezvous watches over the same sockets).
        world
            .launcher
            .allgather("fabric-msg.wired", &[], cfg.start_timeout)?;
        phase("wired");
        world.launcher.watch(world.live.clone())?;
        world.set_up_two_level(two_level, &nodes)?;
        Ok(world)
    }
}

/// How this rank's loops wait (`transport/event_loop/idle.rs`): as `cfg`
/// says, except that where this node runs more ranks than this process
/// has cores (`startup::oversubscribed`) a wait gives the core away from
/// its first empty look: a spinning rank would hold the core the rank it
/// waits for needs to answer (200x slower for a DHT of 4 ranks on 2
/// cores), and sleeps on the CQ's fd after 2 ms of that where no
/// `yield_before_block` was set: the cores are better spent on the ranks
/// that have work. An explicit `WaitMode::Spin` then yields too.
fn waits_for(
    mut cfg: crate::transport::event_loop::LoopConfig,
    local_ranks: usize,
) -> crate::transport::event_loop::LoopConfig {
    if oversubscribed(local_ranks) {
        cfg.spin_before_block = Duration::ZERO;
        cfg.yield_before_block.get_or_insert(Duration::from_millis(2));
        if cfg.wait == WaitMode::Spin {
            cfg.wait = WaitMode::Adaptive;
        }
    }
    cfg
}

/// More ranks on this node (as the launcher says: PMIx's local peers,
/// the rendezvous's hosts) than cores to run them: waits yield the core.
/// The cores are the node's online ones, or fewer where this process's
/// affinity mask (`sched_getaffinity`) allows fewer but more than one: a
/// container or `taskset` limiting the job. A mask of one core is taken
/// for a launcher binding each rank to its own (`mpirun` binds each of 2
/// ranks to its own core of 2, which is not oversubscribed).
pub(crate) fn oversubscribed(local_ranks: usize) -> bool {
    local_ranks > cores()
}

fn cores() -> usize {
    // SAFETY: sysconf only reads a system value.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let online = usize::try_from(online).ok().filter(|&c| c > 0);
    let online = online.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // SAFETY: an all-zero cpu_set_t is a valid empty set; sched_getaffinity
    // writes at most size_of::<cpu_set_t>() bytes into it.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            libc::CPU_COUNT(&set) as usize
        } else {
            0
        }
    };
    if allowed > 1 {
        online.min(allowed)
    } else {
        online
    }
}

/// One postcard-encoded value from every rank, decoded and checked.
pub(crate) fn exchange<T>(launcher: &mut Launcher, round: &str, mine: &T, timeout: Duration) -> Result<Vec<T>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = postcard::to_stdvec(mine).map_err(|e| Error::Encoding(e.to_string()))?;
    let table = launcher.allgather(round, &bytes, timeout)?;
    log::debug!(op = "startup", round = round, bytes = bytes.len(), ranks = table.len();
        "start-up: {round}: {} bytes from this rank, {} in all", bytes.len(), table.iter().map(Vec::len).sum::<usize>());
    table
        .iter()
        .enumerate()
        .map(|(r, b)| {
            postcard::from_bytes(b).map_err(|e| Error::Launch {
                launcher: launcher.name(),
                message: format!(
                    "rank {r} sent a malformed {round} ({e}): is it the same fabric-msg release?"
                ),
            })
        })
        .collect()
}

/// This rank's own best fabric; on an IP fabric, on the interface that
/// reaches the others where that is known.
pub(crate) fn first_choice(
    req: &Requirements,
    ladder: &LadderConfig,
    domain: Option<&str>,
) -> Result<Profile> {
    let found = negotiate(req, ladder)?.profile;
    let ip = matches!(found.fabric_kind, FabricKind::Tcp | FabricKind::Udp);
    match domain {
        Some(d) if ip && found.domain != d => {
            let on = Requirements {
                domain: Some(d.to_string()),
                ..req.clone()
            };
            Ok(negotiate(&on, ladder).map(|n| n.profile).unwrap_or(found))
        }
        _ => Ok(found),
    }
}

/// Open exactly the rung the world decided on.
pub(crate) fn open_rung(
    req: &Requirements,
    ladder: &LadderConfig,
    domain: Option<&str>,
    rung: &ChosenRung,
) -> Result<Profile> {
    let only = Requirements {
        provider: Some(rung.provider.clone()),
        provider_layered: false,
        ..req.clone()
    };
    let p = first_choice(&only, ladder, domain)?;
    if p.rung != rung.label {
        return Err(Error::Usage(format!("opened {} instead", p.rung)));
    }
    Ok(p)
}

pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates
    // within it (or truncates, which the lossy read below tolerates).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The network interface that holds `ip`, e.g. `lo` for 127.0.0.1.
pub(crate) fn interface_of(ip: Option<std::net::IpAddr>) -> Option<String> {
    let ip = ip?;
    if ip.is_loopback() {
        return Some("lo".into());
    }
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates the list; it is freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points at a sockaddr whose family says its type.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(std::net::IpAddr::from(
                        u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(std::net::IpAddr::from(a.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        if addr == Some(ip) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}
