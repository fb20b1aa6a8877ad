//! `finish_serves`: a rank that has finished keeps serving the ranks that
//! have not, until all have.
//!
//! Rank 0 registers a region, fills it with the tools' `--verify` pattern, sends its
//! descriptor to every other rank and calls [`World::finish`] at once.
//! Every other rank then reads the whole region from rank 0, one-sided,
//! checks every byte and finishes. On providers whose progress is manual
//! (`tcp;ofi_rxm`, `shm`) a read is carried out by rank 0's provider,
//! which works only inside a call on rank 0's completion queue: the reads
//! complete only because `finish` keeps reading it while it waits.
//!
//! ```text
//! FABRIC_MSG_RANK=0 FABRIC_MSG_SIZE=3 FABRIC_MSG_ROOT=127.0.0.1:9400 finish_serves   # and ranks 1, 2
//! ```
//!
//! Prints one line per rank; non-zero exit if a read fails, takes longer
//! than 20 s, or brings a wrong byte.

use fabric_msg::{Access, Buffer, Completion, Token, World};
use fabric_msg_examples::pattern::{check, fill};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const LEN: usize = 1 << 20;
const TAG: u32 = 7;
const PATIENCE: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("finish_serves: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Poll until the completion with `token` arrives; its result must be Ok.
fn wait_for(world: &mut World, token: Token, what: &str) -> Result<Completion, String> {
    let until = Instant::now() + PATIENCE;
    let mut out = Vec::new();
    while Instant::now() < until {
        world
            .poll(&mut out, Some(Duration::from_millis(10)))
            .map_err(|e| format!("{what}: {e}"))?;
        if let Some(i) = out.iter().position(|c| c.token == token) {
            let c = out.swap_remove(i);
            c.result.as_ref().map_err(|e| format!("{what}: {e}"))?;
            return Ok(c);
        }
    }
    Err(format!("{what}: no completion within {PATIENCE:?}"))
}

fn run() -> Result<String, String> {
    let mut world = World::init().map_err(|e| e.to_string())?;
    let (rank, size) = (world.rank(), world.size());
    let provider = world.profile().provider.clone();
    if rank == 0 {
        let region = world
            .event_loop()
            .register(LEN, Access::Read)
            .map_err(|e| e.to_string())?;
        let mut bytes = vec![0u8; LEN];
        fill(&mut bytes, 0);
        region.write_at(0, &bytes).map_err(|e| e.to_string())?;
        let desc = region.remote().encode();
        for r in 1..size {
            world
                .send_buffer(r, TAG, Buffer::from_slice(&desc), Token(u64::from(r)))
                .map_err(|e| e.error.to_string())?;
            wait_for(&mut world, Token(u64::from(r)), "sending the descriptor")?;
        }
        // Finish now: the others read `region` while this rank waits.
        world.finish().map_err(|e| e.to_string())?;
        drop(region);
        return Ok(format!(
            "rank 0/{size}: finished at once; {} rank(s) read its {LEN} bytes meanwhile ({provider})",
            size - 1
        ));
    }
    world
        .recv_buffer(Some(0), Some(TAG), Buffer::new(1024), Token(1))
        .map_err(|e| e.error.to_string())?;
    let c = wait_for(&mut world, Token(1), "receiving rank 0's descriptor")?;
    let desc = c
        .buffer
        .ok_or("the descriptor's receive came back without its buffer")?;
    let remote = world
        .event_loop()
        .import(desc.as_slice())
        .map_err(|e| e.to_string())?;
    let local = world
        .event_loop()
        .register(LEN, Access::Write)
        .map_err(|e| e.to_string())?;
    let peer = *world.peer(0).map_err(|e| e.to_string())?;
    let started = Instant::now();
    world
        .event_loop()
        .read(&peer, local.all(), &remote, 0, Token(2))
        .map_err(|e| e.to_string())?;
    wait_for(&mut world, Token(2), "reading rank 0's region after it finished")?;
    let took = started.elapsed();
    let mut got = vec![0u8; LEN];
    local.read_at(0, &mut got).map_err(|e| e.to_string())?;
    check(&got, 0, LEN).map_err(|e| format!("rank 0's region, read after it finished: {e}"))?;
    world.finish().map_err(|e| e.to_string())?;
    drop(local);
    Ok(format!(
        "rank {rank}/{size}: read rank 0's {LEN} bytes after rank 0 finished, in {:.1} ms, every byte right ({provider})",
        took.as_secs_f64() * 1e3
    ))
}
