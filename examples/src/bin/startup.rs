//! `startup`: how long a rank takes to join the world and do its first
//! collectives: `World::init`, then a barrier and an 8-byte allreduce,
//! timed from the start of `main` on every rank. Rank 0 prints one JSON
//! object: `ranks`, `init_ms` and `total_ms` (the slowest rank's, from an
//! allreduce of the times). `ci/bench/startup.sh` runs it beside
//! `ci/bench/startup_mpi.c` (the same steps with MPI).
//!
//! ```text
//! mpirun -np 16 target/release/startup
//! ```

use fabric_msg::prelude::*;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let t0 = Instant::now();
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("startup: {e}");
            return ExitCode::FAILURE;
        }
    };
    let init = t0.elapsed().as_secs_f64() * 1e3;
    let run = |world: &mut World| -> fabric_msg::Result<[f64; 2]> {
        world.barrier()?;
        let mut x = [1.0f64];
        world.allreduce(&mut x, Op::Sum)?;
        if x[0] != f64::from(world.size()) {
            return Err(fabric_msg::Error::Usage(format!("allreduce gave {}", x[0])));
        }
        let mut slowest = [init, t0.elapsed().as_secs_f64() * 1e3];
        world.allreduce(&mut slowest, Op::Max)?;
        Ok(slowest)
    };
    match run(&mut world) {
        Ok([init_ms, total_ms]) => {
            if world.rank() == 0 {
                println!(
                    "{{\"tool\":\"startup\",\"ranks\":{},\"provider\":\"{}\",\"init_ms\":{init_ms:.1},\"total_ms\":{total_ms:.1}}}",
                    world.size(),
                    world.profile().provider
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("startup: rank {}: {e}", world.rank());
            ExitCode::FAILURE
        }
    }
}
