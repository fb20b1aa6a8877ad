//! `monitor_race`: open and close event loops on one domain while another
//! thread maps and unmaps memory, as a multi-threaded application does.
//!
//! libfabric's default memory-registration monitor, memhooks, rewrites the
//! first instructions of libc's `mmap`, `munmap`, `brk` and friends in place
//! when a domain's registration cache starts it, and writes them back when
//! the last cache stops: a thread inside one of those functions at that
//! moment runs half-written code. On rxe0 a C program that opened and
//! closed a `verbs;ofi_rxm` domain 300 times beside such a thread died of
//! SIGSEGV in 3 of 3 runs, with libfabric 1.17 and with 2.1; with
//! `FI_MR_CACHE_MONITOR=userfaultfd` it passed 3 of 3. fabric-msg sets that
//! where an RDMA device is present unless the user chose a monitor
//! (`fabric_info` shows it), and this tool is its check in the VM matrix.
//!
//!     monitor_race [-p PROVIDER] [-d DOMAIN] [-n LOOPS]

use fabric_msg::{negotiate, Access, EventLoop, LadderConfig, LoopConfig, Requirements};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const USAGE: &str = "usage: monitor_race [-p PROVIDER] [-d DOMAIN] [-n LOOPS (default 200)]";

fn main() -> ExitCode {
    let mut req = Requirements::default();
    let mut loops = 200u32;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let Some(v) = it.next() else {
            eprintln!("monitor_race: {a} needs a value\n{USAGE}");
            return ExitCode::from(2);
        };
        match a.as_str() {
            "-p" => req.provider = Some(v),
            "-d" => req.domain = Some(v),
            "-n" => match v.parse() {
                Ok(n) => loops = n,
                Err(_) => {
                    eprintln!("monitor_race: -n {v}: not a number\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("monitor_race: unknown option {a}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match run(&req, loops) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monitor_race: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One `mmap` and `munmap` of 1 MiB, straight to libc: an allocator would
/// soon keep such blocks (glibc raises its mmap threshold after the first
/// free) and call neither.
fn map_and_unmap() {
    const LEN: usize = 1 << 20;
    // SAFETY: an anonymous private mapping owned by nothing else; one byte
    // of it is written while it is mapped, and it is unmapped once, with
    // the length it was mapped with.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p != libc::MAP_FAILED {
            p.cast::<u8>().write_volatile(1);
            libc::munmap(p, LEN);
        }
    }
}

fn run(req: &Requirements, loops: u32) -> fabric_msg::Result<()> {
    let found = negotiate(req, &LadderConfig::load(None)?)?;
    let profile = found.profile;
    let stop = Arc::new(AtomicBool::new(false));
    let maps = Arc::new(AtomicU64::new(0));
    let churn = {
        let (stop, maps) = (stop.clone(), maps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                map_and_unmap();
                maps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut result = Ok(());
    for _ in 0..loops {
        let opened = EventLoop::new(&profile, LoopConfig::default())
            .and_then(|mut ev| ev.register(1 << 16, Access::Read).map(drop));
        if let Err(e) = opened {
            result = Err(e);
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = churn.join();
    result?;
    println!(
        "monitor_race: {loops} loops opened and closed on {} domain {} while another thread mapped and unmapped \
         1 MiB {} times; FI_MR_CACHE_MONITOR={}",
        profile.provider,
        profile.domain,
        maps.load(Ordering::Relaxed),
        std::env::var("FI_MR_CACHE_MONITOR").unwrap_or_else(|_| "(libfabric's default)".into())
    );
    Ok(())
}
