//! `depart`: a rank leaves the world in a way the others do not expect,
//! written as a user writes an SPMD program (`main` returns the World's
//! error with `?`). For the departure tests (`examples/tests/departures.rs`).
//!
//! ```text
//! depart --skip RANK   # RANK skips the barrier the others wait in and calls finish
//! depart --die RANK    # RANK SIGKILLs itself after the first barrier
//! ```
//!
//! Every rank prints `rank R/N: formed` once the world is up; the others
//! loop on barriers until the World reports the departure, and `main`
//! returns that error (exit status 1, `Error: ...` on stderr).

use fabric_msg::World;

enum Mode {
    Skip(u32),
    Die(u32),
}

fn parse() -> Result<Mode, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rank = |s: Option<&String>| {
        s.and_then(|s| s.parse::<u32>().ok())
            .ok_or_else(|| "give a rank after --skip or --die".to_string())
    };
    match args.first().map(String::as_str) {
        Some("--skip") => Ok(Mode::Skip(rank(args.get(1))?)),
        Some("--die") => Ok(Mode::Die(rank(args.get(1))?)),
        _ => Err("usage: depart --skip RANK | --die RANK".into()),
    }
}

fn main() -> Result<(), fabric_msg::Error> {
    let mode = parse().map_err(fabric_msg::Error::Usage)?;
    let mut world = World::init()?;
    let me = world.rank();
    println!("rank {me}/{}: formed", world.size());
    std::io::Write::flush(&mut std::io::stdout()).ok();
    match mode {
        Mode::Skip(r) if r == me => {
            // A different collective than the others: none at all. Its
            // finish waits for the others, who never finish, and fails.
            world.finish()
        }
        Mode::Die(r) => {
            world.barrier()?;
            if r == me {
                // When, for the measurements in docs/world.md.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let line = format!("rank {me}: SIGKILL at {:.6}\n", now.as_secs_f64());
                std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes()).ok();
                // SAFETY: kill(2) on this process: it ends here, as a crash
                // or an OOM kill would end it.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            loop {
                world.barrier()?;
            }
        }
        Mode::Skip(_) => loop {
            world.barrier()?;
        },
    }
}
