//! `mr_cost`: what registering memory per operation costs next to taking a
//! slot of a pre-registered pool, on the negotiated (or `-p`/`-d`) fabric.
//! No peer is needed: it times `fi_mr_reg` + `fi_close` of the same memory
//! against `RegionPool::take` + drop, per size.
//!
//! usage: mr_cost [-p PROVIDER] [-d DOMAIN] [-e rdm|msg] [-I ITERATIONS] [--same-host]

use fabric_msg::discovery::negotiate::{Capability, EndpointChoice};
use fabric_msg::{negotiate, Access, EventLoop, LadderConfig, LoopConfig, Requirements};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mr_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut req = Requirements {
        caps: vec![Capability::Msg, Capability::Rma],
        ..Default::default()
    };
    let mut iters = 200usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-p" => req.provider = Some(val()?),
            "-d" => req.domain = Some(val()?),
            "-e" if val()? == "msg" => req.endpoint = EndpointChoice::Msg,
            "-e" => {}
            "-I" => iters = val()?.parse()?,
            "--same-host" => req.same_host = true,
            _ => {
                return Err(format!(
                    "unknown option {a}\nusage: mr_cost [-p PROVIDER] [-d DOMAIN] [-e rdm|msg] [-I N] [--same-host]"
                )
                .into())
            }
        }
    }
    let profile = negotiate(&req, &LadderConfig::load(None)?)?.profile;
    let mut ev = EventLoop::new(&profile, LoopConfig::default())?;
    let _ep = ev.open_endpoint()?;
    fabric_msg_examples::say!(
        "# {} ({}) domain {}, mr_mode {:?}",
        profile.provider,
        profile.fabric_kind,
        profile.domain,
        profile.mr_mode
    );
    fabric_msg_examples::say!(
        "{:<10} {:>22} {:>20} {:>8}",
        "bytes",
        "register+close usec",
        "pool take+drop usec",
        "ratio"
    );
    for size in [4096usize, 65536, 1 << 20, 4 << 20, 16 << 20] {
        let mut mem = vec![1u8; size];
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: `mem` outlives the region, which is dropped at once and
            // used by no operation.
            let r = unsafe { ev.register_borrowed(mem.as_mut_ptr(), size, Access::ReadWrite)? };
            drop(r);
        }
        let each = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let pool = ev.register_pool(size, 1, Access::ReadWrite)?;
        let t = Instant::now();
        for _ in 0..iters {
            drop(pool.take().ok_or("pool slot in use")?);
        }
        let pooled = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        fabric_msg_examples::say!(
            "{size:<10} {each:>22.2} {pooled:>20.3} {:>8.0}",
            each / pooled.max(1e-3)
        );
    }
    Ok(())
}
