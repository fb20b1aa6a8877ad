//! Helpers of `World::init`: the exchanges, each rank's own negotiation,
//! and what the host says of itself (its name, its interfaces, its cores).

use super::agree::ChosenRung;
use super::launch::Launcher;
use crate::discovery::classify::FabricKind;
use crate::discovery::config::LadderConfig;
use crate::discovery::negotiate::{negotiate, Requirements};
use crate::discovery::profile::Profile;
use crate::error::{Error, Result};
use std::time::Duration;

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
