//! RDMA device limits that libfabric does not report.
//!
//! `verbs;ofi_rxm` opens one verbs completion queue per endpoint of
//! `(msg_rx_size + msg_tx_size) * FI_UNIVERSE_SIZE` entries (libfabric 1.17,
//! `prov/rxm/src/rxm_ep.c`), and libfabric reads `FI_UNIVERSE_SIZE` once, when
//! it initialises. With the default universe of 256 that CQ is 65 536 entries;
//! soft-RoCE's `max_cqe` is 32 767, so `fi_enable` fails with `-FI_EINVAL`.
//! `fi_info` does not show `max_cqe`, so fabric-msg asks libibverbs directly,
//! before libfabric starts, and sizes the universe to fit.
//!
//! libibverbs is loaded with `dlopen`, so hosts without it lose nothing.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

/// Why fabric-msg picks libfabric's userfaultfd memory monitor where an
/// RDMA device is present (unless the user chose one). The default,
/// memhooks, rewrites the first instructions of libc's `mmap`, `munmap`,
/// `brk` and friends in place when a registration cache (verbs opens one
/// per domain) starts it, and writes them back when the last one stops: a
/// thread inside one of those functions at that moment runs half-written
/// code. On rxe0, opening and closing a `verbs;ofi_rxm` domain 300 times
/// beside a thread that maps and unmaps memory died of SIGSEGV in 3 of 3
/// runs on libfabric 1.17 and on 2.1, and passed 3 of 3 with userfaultfd
/// (`monitor_race`, docs/fabrics.md). Where userfaultfd is not permitted,
/// verbs opens its domain without a cache (registrations are not reused).
pub(crate) const MONITOR_WHY: &str =
    "fabric-msg: libfabric's default memory monitor (memhooks) patches libc's \
     mmap/munmap code while the process runs, which crashed a thread in munmap as a verbs domain opened or \
     closed; userfaultfd watches the same events from the kernel";

/// The libfabric settings the RDMA devices present call for, as (name,
/// value, why): rxm's shared receive context on iWARP
/// ([`rxm_needs_srx`]), the userfaultfd memory monitor wherever there is a
/// device ([`MONITOR_WHY`]).
pub(crate) fn env_settings(
    devices: &[DeviceLimits],
    domain: Option<&str>,
) -> Vec<(&'static str, &'static str, String)> {
    let mut v = Vec::new();
    if let Some(why) = rxm_needs_srx(devices, domain) {
        v.push(("FI_OFI_RXM_USE_SRX", "1", why));
    }
    if !devices.is_empty() {
        v.push(("FI_MR_CACHE_MONITOR", "userfaultfd", MONITOR_WHY.to_string()));
    }
    v
}

/// Limits of one RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Device name, e.g. `mlx5_0`, `rxe0`.
    pub name: String,
    /// Most entries in one completion queue (`max_cqe`).
    pub max_cqe: u32,
    /// Most outstanding work requests on one queue pair (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Whether the device does remote atomics at all (`atomic_cap` other
    /// than `IBV_ATOMIC_NONE`): soft-iWARP has none, though libfabric's
    /// `fi_atomicvalid` on verbs does not ask the device.
    pub atomics: bool,
    /// `vendor_id` from `ibv_query_device`: soft-iWARP's is
    /// [`SIW_VENDOR_ID`].
    pub vendor_id: u32,
    /// An iWARP device (sysfs `node_type` `4: RNIC`).
    pub iwarp: bool,
}

/// Whether `device` is an iWARP device, from sysfs.
fn is_iwarp(device: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/node_type"))
        .is_ok_and(|t| t.trim_start().starts_with('4'))
}

/// Why ofi_rxm must receive into a shared receive context
/// (`FI_OFI_RXM_USE_SRX=1`), if it must: it will run on an iWARP device
/// ([`rxm_iwarp_device`]). Without one, closing a connection reposts a
/// receive on that connection's closed MSG endpoint (`rxm_close_conn`, 1.17
/// and 2.1; SIGSEGV between two soft-iWARP guests). Not on RoCE: there, RMA
/// writes with immediate data to an rxm endpoint with a shared context
/// never completed on rxe0 (1.17). docs/decisions.md, "rxm over soft-iWARP".
pub fn rxm_needs_srx(devices: &[DeviceLimits], domain: Option<&str>) -> Option<String> {
    rxm_iwarp_device(devices, domain).map(|d| {
        format!(
            "fabric-msg: ofi_rxm over iWARP ({}) reposts receives on a closed connection's endpoint without a shared receive context",
            d.name
        )
    })
}

/// The iWARP device ofi_rxm will run on, if it will: the domain asked for,
/// when that is an iWARP device, or with no domain asked for, the only
/// kind of device there is.
pub fn rxm_iwarp_device<'a>(devices: &'a [DeviceLimits], domain: Option<&str>) -> Option<&'a DeviceLimits> {
    match domain {
        Some(d) => devices.iter().find(|x| x.name == d && x.iwarp),
        None if devices.iter().all(|x| x.iwarp) => devices.first(),
        None => None,
    }
}

/// soft-iWARP's `vendor_id` (`SIW_VENDOR_ID`, "bmt", in the kernel's
/// `drivers/infiniband/sw/siw/siw.h`).
pub const SIW_VENDOR_ID: u32 = 0x626d74;

/// ofi_rxm's eager buffer size (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by default).
const RXM_DEFAULT_BUFFER_SIZE: u64 = 16384;
/// Buffers in one chunk of ofi_rxm's receive and transmit pools
/// (`chunk_cnt` in `rxm_ep_create_pools`, 1.17 and 2.1).
const RXM_POOL_CHUNK: u64 = 1024;
/// Room for rxm's per-buffer header (`struct rxm_rx_buf`/`rxm_tx_buf` and
/// the packet header, a few hundred bytes), rounded up.
const RXM_BUFFER_OVERHEAD: u64 = 512;

/// The memory one `ofi_rxm` endpoint registers for its own buffers by its
/// first message: the first chunk of its receive pool and of its transmit
/// pool, each 1024 buffers of `FI_OFI_RXM_BUFFER_SIZE` plus a header. With
/// the defaults about 33 MiB; measured on soft-iWARP with libfabric 1.17:
/// `VmPin` 33,616 kB per `fi_pingpong` process.
pub fn rxm_pinned_bytes(buffer_size: Option<u64>) -> u64 {
    let b = buffer_size.filter(|&v| v > 0).unwrap_or(RXM_DEFAULT_BUFFER_SIZE);
    2 * RXM_POOL_CHUNK * (b + RXM_BUFFER_OVERHEAD)
}

/// A locked-memory limit too low for `ofi_rxm` on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemlockShortfall {
    /// The device, e.g. `siw0`.
    pub device: String,
    /// The soft `RLIMIT_MEMLOCK`, bytes.
    pub limit: u64,
    /// What one rxm endpoint registers, bytes ([`rxm_pinned_bytes`]).
    pub need: u64,
    /// Whether the device counts registrations even with `CAP_IPC_LOCK`
    /// (soft-iWARP does; other verbs devices exempt such processes).
    pub counts_always: bool,
}

/// Whether `ofi_rxm` on `domain` must fail its first message for lack of
/// locked memory: the device's registrations count against the process's
/// `RLIMIT_MEMLOCK` (`limit`, `None` when unlimited) and the limit is below
/// what rxm registers for its buffers. Registrations count on soft-iWARP
/// always (`siw_umem_get` checks the limit and nothing else); on other
/// devices only without `CAP_IPC_LOCK` (`ib_umem_get`).
pub fn rxm_memlock_shortfall(
    devices: &[DeviceLimits],
    domain: &str,
    limit: Option<u64>,
    cap_ipc_lock: bool,
    buffer_size: Option<u64>,
) -> Option<MemlockShortfall> {
    let limit = limit?;
    let dev = devices.iter().find(|d| d.name == domain)?;
    let counts_always = dev.vendor_id == SIW_VENDOR_ID;
    let need = rxm_pinned_bytes(buffer_size);
    (limit < need && (counts_always || !cap_ipc_lock)).then(|| MemlockShortfall {
        device: dev.name.clone(),
        limit,
        need,
        counts_always,
    })
}

/// [`rxm_memlock_shortfall`] for this process: its limit, its
/// `CAP_IPC_LOCK`, and `FI_OFI_RXM_BUFFER_SIZE` if set.
pub fn rxm_memlock_here(devices: &[DeviceLimits], domain: &str) -> Option<MemlockShortfall> {
    let (limit, cap_ipc_lock) = locked_memory();
    let buffer = std::env::var("FI_OFI_RXM_BUFFER_SIZE")
        .ok()
        .and_then(|v| v.parse().ok());
    rxm_memlock_shortfall(devices, domain, limit, cap_ipc_lock, buffer)
}

/// This process's soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited or
/// unknown) and whether it has `CAP_IPC_LOCK` (from `/proc/self/status`).
pub fn locked_memory() -> (Option<u64>, bool) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct rlimit, which lim is.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0
        && lim.rlim_cur != libc::RLIM_INFINITY
    {
        Some(lim.rlim_cur)
    } else {
        None
    };
    const CAP_IPC_LOCK: u32 = 14;
    let cap = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
    (limit, cap)
}

/// ofi_rxm's default MSG endpoint queue depth (`RXM_MSG_RXTX_SIZE`).
const RXM_DEFAULT_MSG_SIZE: u64 = 128;
/// ofi_rxm's shared receive queue depth (`RXM_MSG_SRX_SIZE`).
const RXM_DEFAULT_SRX_SIZE: u64 = 4096;

/// The largest `FI_UNIVERSE_SIZE` for which every device's `max_cqe` holds
/// ofi_rxm's completion queue, given rxm's own tunables (`msg_tx_size`,
/// `msg_rx_size`, `use_srx`). `None` when there are no devices.
pub fn max_rxm_universe(
    devices: &[DeviceLimits],
    msg_tx: Option<u64>,
    msg_rx: Option<u64>,
    use_srx: bool,
) -> Option<u64> {
    let tx = msg_tx.filter(|&v| v > 0).unwrap_or(RXM_DEFAULT_MSG_SIZE);
    let min_cqe = devices.iter().map(|d| u64::from(d.max_cqe)).min()?;
    // rxm: size = rx * universe (rx * 1 with a shared receive queue) + tx * universe.
    let (fixed, per_peer) = if use_srx {
        (msg_rx.filter(|&v| v > 0).unwrap_or(RXM_DEFAULT_SRX_SIZE), tx)
    } else {
        (0, tx + msg_rx.filter(|&v| v > 0).unwrap_or(RXM_DEFAULT_MSG_SIZE))
    };
    Some(min_cqe.saturating_sub(fixed) / per_peer)
}

/// Query every RDMA device through libibverbs. An empty list when libibverbs
/// is not installed or there are no devices.
pub fn query_devices() -> Vec<DeviceLimits> {
    match Verbs::load() {
        Some(v) => v.devices(),
        None => Vec::new(),
    }
}

// The start of `struct ibv_device_attr` (rdma-core's <infiniband/verbs.h>,
// stable ABI since libibverbs 1.1) up to `atomic_cap`. The buffer passed to
// ibv_query_device is larger than the whole struct (232 bytes); only these
// leading fields are read.
#[repr(C)]
struct DeviceAttrHead {
    fw_ver: [c_char; 64],
    node_guid: u64,
    sys_image_guid: u64,
    max_mr_size: u64,
    page_size_cap: u64,
    vendor_id: u32,
    vendor_part_id: u32,
    hw_ver: u32,
    max_qp: c_int,
    max_qp_wr: c_int,
    device_cap_flags: u32,
    max_sge: c_int,
    max_sge_rd: c_int,
    max_cq: c_int,
    max_cqe: c_int,
    max_mr: c_int,
    max_pd: c_int,
    max_qp_rd_atom: c_int,
    max_ee_rd_atom: c_int,
    max_res_rd_atom: c_int,
    max_qp_init_rd_atom: c_int,
    max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`: 0 is `IBV_ATOMIC_NONE`.
    atomic_cap: c_int,
}

#[repr(C, align(8))]
struct DeviceAttrBuf([u8; 512]);

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;

struct Verbs {
    handle: *mut c_void,
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_device: QueryDevice,
}

impl Verbs {
    fn load() -> Option<Verbs> {
        // SAFETY: dlopen with a constant NUL-terminated name; a NULL result
        // means the library is absent, which is fine.
        let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        let sym = |name: &CStr| -> Option<*mut c_void> {
            // SAFETY: handle is a live dlopen handle; name is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let loaded = (|| {
            // SAFETY: each symbol is a libibverbs function with exactly the C
            // signature of the type it is transmuted to (see verbs.h).
            unsafe {
                Some(Verbs {
                    handle,
                    get_device_list: std::mem::transmute::<*mut c_void, GetDeviceList>(sym(
                        c"ibv_get_device_list",
                    )?),
                    free_device_list: std::mem::transmute::<*mut c_void, FreeDeviceList>(sym(
                        c"ibv_free_device_list",
                    )?),
                    get_device_name: std::mem::transmute::<*mut c_void, GetDeviceName>(sym(
                        c"ibv_get_device_name",
                    )?),
                    open_device: std::mem::transmute::<*mut c_void, OpenDevice>(sym(c"ibv_open_device")?),
                    close_device: std::mem::transmute::<*mut c_void, CloseDevice>(sym(c"ibv_close_device")?),
                    query_device: std::mem::transmute::<*mut c_void, QueryDevice>(sym(c"ibv_query_device")?),
                })
            }
        })();
        if loaded.is_none() {
            // SAFETY: handle came from dlopen and is closed once.
            unsafe { libc::dlclose(handle) };
        }
        loaded
    }

    fn devices(&self) -> Vec<DeviceLimits> {
        let mut out = Vec::new();
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list writes the count and returns a
        // NULL-terminated array (or NULL) that we free below.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return out;
        }
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: i < n, the array's length.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: dev is a device from the list; the name is a C string
            // owned by the device and copied before the list is freed.
            let name = unsafe { CStr::from_ptr((self.get_device_name)(dev)) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: opening a listed device; closed below on every path.
            let ctx = unsafe { (self.open_device)(dev) };
            if ctx.is_null() {
                log::debug!("libibverbs could not open {name}; its limits are unknown");
                continue;
            }
            let mut buf = DeviceAttrBuf([0; 512]);
            // SAFETY: ctx is open; buf is larger than struct ibv_device_attr
            // and 8-byte aligned, as the struct requires.
            let rc = unsafe { (self.query_device)(ctx, buf.0.as_mut_ptr().cast()) };
            if rc == 0 {
                // SAFETY: buf holds an initialised ibv_device_attr whose leading
                // fields have the layout of DeviceAttrHead.
                let head = unsafe { &*(buf.0.as_ptr() as *const DeviceAttrHead) };
                let iwarp = is_iwarp(&name);
                out.push(DeviceLimits {
                    name,
                    max_cqe: u32::try_from(head.max_cqe).unwrap_or(0),
                    max_qp_wr: u32::try_from(head.max_qp_wr).unwrap_or(0),
                    atomics: head.atomic_cap != 0,
                    vendor_id: head.vendor_id,
                    iwarp,
                });
            }
            // SAFETY: ctx was opened above and is closed once.
            unsafe { (self.close_device)(ctx) };
        }
        // SAFETY: list came from ibv_get_device_list and is freed once.
        unsafe { (self.free_device_list)(list) };
        out
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // SAFETY: handle came from dlopen; nothing from it outlives self.
        unsafe { libc::dlclose(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(max_cqe: u32) -> DeviceLimits {
        DeviceLimits {
            name: "d".into(),
            max_cqe,
            max_qp_wr: 16384,
            atomics: true,
            vendor_id: 0x02c9,
            iwarp: false,
        }
    }

    fn siw() -> DeviceLimits {
        DeviceLimits {
            name: "siw0".into(),
            max_cqe: 3_276_800,
            max_qp_wr: 32768,
            atomics: false,
            vendor_id: SIW_VENDOR_ID,
            iwarp: true,
        }
    }

    #[test]
    fn rxm_runs_on_iwarp_when_asked_for_it_or_when_all_there_is() {
        let both = [dev(32767), siw()];
        assert_eq!(
            rxm_iwarp_device(&both, Some("siw0")).map(|d| d.name.as_str()),
            Some("siw0")
        );
        assert!(rxm_iwarp_device(&both, Some("d")).is_none());
        assert!(
            rxm_iwarp_device(&both, None).is_none(),
            "RoCE comes first on the ladder"
        );
        assert!(rxm_iwarp_device(&[siw()], None).is_some());
        assert!(rxm_iwarp_device(&[], None).is_none());
    }

    #[test]
    fn any_rdma_device_asks_for_the_userfaultfd_monitor_and_iwarp_for_srx() {
        let names = |devs: &[DeviceLimits], d: Option<&str>| -> Vec<&str> {
            env_settings(devs, d).into_iter().map(|(n, _, _)| n).collect()
        };
        assert!(env_settings(&[], None).is_empty(), "no device, no setting");
        assert_eq!(names(&[dev(32767)], None), ["FI_MR_CACHE_MONITOR"]);
        assert_eq!(
            names(&[siw()], None),
            ["FI_OFI_RXM_USE_SRX", "FI_MR_CACHE_MONITOR"]
        );
        let (_, value, _) = env_settings(&[dev(32767)], None).remove(0);
        assert_eq!(value, "userfaultfd");
    }

    #[test]
    fn rxm_registers_two_pool_chunks_of_its_buffer_size() {
        // 2 x 1024 x (16 KiB + header): the 33,616 kB VmPin measured on siw0.
        assert_eq!(rxm_pinned_bytes(None), 2 * 1024 * (16384 + 512));
        assert!(rxm_pinned_bytes(None) > 33_616 * 1024);
        assert_eq!(rxm_pinned_bytes(Some(4096)), 2 * 1024 * (4096 + 512));
    }

    #[test]
    fn a_low_memlock_limit_passes_rxm_over_on_siw_even_for_root() {
        let devs = [dev(32767), siw()];
        let mib = 1 << 20;
        // The guest's old default (8 MiB), root (CAP_IPC_LOCK): siw still counts.
        let s = rxm_memlock_shortfall(&devs, "siw0", Some(8 * mib), true, None).expect("shortfall");
        assert_eq!(
            (s.device.as_str(), s.limit, s.counts_always),
            ("siw0", 8 * mib, true)
        );
        // 32 MiB failed in the VM too; 64 MiB and unlimited worked.
        assert!(rxm_memlock_shortfall(&devs, "siw0", Some(32 * mib), true, None).is_some());
        assert_eq!(
            rxm_memlock_shortfall(&devs, "siw0", Some(64 * mib), true, None),
            None
        );
        assert_eq!(rxm_memlock_shortfall(&devs, "siw0", None, false, None), None);
        // Other devices exempt CAP_IPC_LOCK (rxe0 ran with 8 MiB as root).
        assert_eq!(rxm_memlock_shortfall(&devs, "d", Some(8 * mib), true, None), None);
        assert!(rxm_memlock_shortfall(&devs, "d", Some(8 * mib), false, None).is_some());
        // A smaller rxm buffer needs less; an unknown domain is not judged.
        assert_eq!(
            rxm_memlock_shortfall(&devs, "siw0", Some(8 * mib), true, Some(2048)),
            None
        );
        assert_eq!(
            rxm_memlock_shortfall(&devs, "mlx5_0", Some(mib), false, None),
            None
        );
    }

    #[test]
    fn this_process_reads_its_locked_memory_limit() {
        let (limit, _cap) = locked_memory();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one struct rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) }, 0);
        let want = (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur);
        assert_eq!(limit, want);
    }

    #[test]
    fn soft_roce_max_cqe_gives_a_universe_of_127() {
        // rxe's max_cqe is 32767: (128 + 128) * 127 = 32512 fits, 128 would not.
        assert_eq!(max_rxm_universe(&[dev(32767)], None, None, false), Some(127));
        // The smallest device decides.
        assert_eq!(
            max_rxm_universe(&[dev(4_194_303), dev(32767)], None, None, false),
            Some(127)
        );
        assert_eq!(max_rxm_universe(&[], None, None, false), None);
    }

    #[test]
    fn rxm_tunables_change_the_bound() {
        // With a shared receive queue only tx scales with the universe.
        assert_eq!(
            max_rxm_universe(&[dev(32767)], None, None, true),
            Some((32767 - 4096) / 128)
        );
        assert_eq!(
            max_rxm_universe(&[dev(32767)], Some(64), Some(64), false),
            Some(255)
        );
    }

    #[test]
    fn device_attr_head_matches_verbs_h_offsets() {
        assert_eq!(std::mem::offset_of!(DeviceAttrHead, max_qp_wr), 112);
        assert_eq!(std::mem::offset_of!(DeviceAttrHead, max_cqe), 132);
    }

    #[test]
    fn a_host_without_rdma_devices_reports_none() {
        // This host may or may not have libibverbs; either way it must not fail.
        let devs = query_devices();
        if std::path::Path::new("/sys/class/infiniband")
            .read_dir()
            .map(|mut d| d.next().is_none())
            .unwrap_or(true)
        {
            assert!(devs.is_empty(), "{devs:?}");
        }
    }
}
